"""Seeded random rotations of R^d, as TurboQuant (arXiv 2504.19874) applies before quantizing.

Motivation: after a uniformly random rotation, each coordinate of a unit vector follows one fixed
law (see :mod:`seqkv.quantizers.lloyd_max`) whatever the vector was, so one scalar codebook
serves every coordinate of every vector. Two constructions:

- ``"orthogonal"``: a Haar-random orthogonal matrix: the Q factor of the QR decomposition of a
  seeded standard Gaussian matrix, with column signs corrected by ``sign(diag(R))`` (without the
  correction QR's sign convention biases the distribution away from Haar). O(d^2) per vector.
- ``"hadamard"``: a randomized Hadamard transform ``y = H diag(s) x / sqrt(d)``, ``s`` seeded
  random signs and ``H`` the Walsh-Hadamard matrix, applied by the O(d log d) butterfly.
  ``d`` must be a power of two.

This module draws the rotation; applying it is the kernel layer's
(:func:`seqkv.kernels.turboquant.naive.rotate`, and inside the fused TurboQuant kernels), which
reads a :class:`Rotation` through its ``signs`` and ``matrix`` fields
(:class:`seqkv.kernels.RotationOperand`).

Invariants:
1. Both maps are orthogonal: ``inverse(forward(x)) == x`` and norms are preserved, to float32
   rounding (checked: ``tests/test_quantizers_turboquant.py``).
2. The maps depend only on ``(dim, kind)`` and the state of the generator passed in; no global
   RNG is touched (enforced: every draw names its ``torch.Generator``).
3. ``"orthogonal"`` is Haar-distributed over the seed, so the rotated coordinates of any fixed
   unit vector follow the sphere law exactly (assumed: standard result on sign-corrected QR).
4. ``"hadamard"`` is *not* Haar: for a fixed input the rotated coordinates follow the sphere law
   only approximately (an input along a coordinate axis maps to coordinates of equal magnitude
   ``1/sqrt(d)``). It is exact in law when the input itself is uniformly distributed on the
   sphere (assumed; this is the deviation every fast TurboQuant variant makes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from seqkv.errors import QuantizerConfigError
from seqkv.kernels.turboquant.naive import rotate, unrotate

RotationKind = Literal["orthogonal", "hadamard"]


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True, eq=False)
class Rotation:
    """A fixed orthogonal map of R^dim, applied along the last dimension."""

    kind: RotationKind
    dim: int
    matrix: torch.Tensor | None
    """``[D, D]`` float32 orthogonal matrix (``"orthogonal"``), else ``None``."""
    signs: torch.Tensor | None
    """``[D]`` float32 random +-1 (``"hadamard"``), else ``None``."""

    @classmethod
    def draw(cls, dim: int, kind: RotationKind, generator: torch.Generator) -> Rotation:
        """Draw a rotation from ``generator`` (advancing it).

        >>> r = Rotation.draw(4, "hadamard", torch.Generator().manual_seed(0))
        >>> r.signs.abs().tolist(), r.matrix is None
        ([1.0, 1.0, 1.0, 1.0], True)
        """
        if kind == "orthogonal":
            gauss = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
            q, r = torch.linalg.qr(gauss)
            # NOTE: sign correction makes Q Haar-distributed (Mezzadri 2007).
            d = torch.sign(torch.diagonal(r))
            d = torch.where(d == 0, torch.ones_like(d), d)
            return cls(kind=kind, dim=dim, matrix=(q * d).to(torch.float32), signs=None)
        if kind == "hadamard":
            if not is_power_of_two(dim):
                raise QuantizerConfigError(
                    f"rotation='hadamard' needs a power-of-two dim, got {dim}; "
                    "use rotation='orthogonal' for this head dimension"
                )
            bits = torch.randint(0, 2, (dim,), generator=generator)
            return cls(kind=kind, dim=dim, matrix=None, signs=(2 * bits - 1).to(torch.float32))
        raise QuantizerConfigError(f"rotation must be 'orthogonal' or 'hadamard', got {kind!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = R x`` for each vector ``x`` along the last dim (float32)."""
        return rotate(x, self)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """``x = R^T y``."""
        return unrotate(y, self)

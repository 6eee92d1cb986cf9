"""TurboQuant_mse (arXiv 2504.19874, Algorithm 1): the torch reference, and the CPU path of
:class:`seqkv.quantizers.TurboQuantMSE` and of the MSE stage of ``TurboQuantProd``.

Motivation: the reference for the fused kernels in ``triton.py``, written as the plain sequence
of steps: norm, normalise, rotate, Lloyd-Max bucket, bit-pack; and back: unpack, codebook
lookup, inverse rotation, times the norm. The rotation is either a dense orthogonal matrix
(``y = M u``, the paper's random rotation) or the randomized Hadamard transform
(``y = H diag(s) u / sqrt(d)``, the fast variant).

Invariants:
1. The squared norm is a pairwise tree sum (:func:`seqkv.kernels.common.naive.vector_norms`),
   its root correctly rounded, and the Hadamard scale ``1/sqrt(d)`` a float32 multiply: with the
   Hadamard rotation every step is an IEEE operation in a fixed order, so codes and norms equal
   the kernel's exactly (checked: ``tests/test_kernels_turboquant.py``).
2. With the orthogonal rotation the product ``u M^T`` is a library matrix product here and a
   ``tl.dot`` in the kernel; their summation orders differ, so a code may differ where a rotated
   coordinate lies within float32 rounding of a threshold (checked: the same tests bound the
   count and the distance). Norms still equal exactly.
3. ``x`` is ``[N, D]``; the Hadamard rotation needs ``D`` a power of two (assumed; the op
   function checks).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from ..common.bitpack import pack_bits, unpack_bits
from ..common.naive import butterfly, vector_norms

TINY = 1e-30
"""Floor on norms before dividing: a zero vector rotates and decodes to zero."""


class RotationOperand(Protocol):
    """The fixed rotation of a TurboQuant quantizer: exactly one of the two is set."""

    @property
    def signs(self) -> torch.Tensor | None:
        """``[D]`` float32 random +-1: the randomized Hadamard rotation ``H diag(s) / sqrt(d)``."""
        ...

    @property
    def matrix(self) -> torch.Tensor | None:
        """``[D, D]`` float32 orthogonal matrix ``M``: the rotation ``u -> M u``."""
        ...


def inverse_sqrt_dim(dim: int) -> float:
    """``1 / sqrt(dim)``; both backends round it to float32 once."""
    return 1.0 / math.sqrt(dim)


def _scale(dim: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(inverse_sqrt_dim(dim), dtype=torch.float32, device=device)


def walsh_hadamard(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform along the last dim (a power of two), O(d log d):
    the butterfly times ``float32(1 / sqrt(d))``. Symmetric and orthogonal: its own inverse.

    >>> walsh_hadamard(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    tensor([0.5000, 0.5000, 0.5000, 0.5000])
    """
    return butterfly(x) * _scale(x.shape[-1], x.device)


def rotate(unit: torch.Tensor, rotation: RotationOperand) -> torch.Tensor:
    """``y = R u`` for float32 rows ``[..., D]``."""
    if rotation.matrix is not None:
        return unit @ rotation.matrix.to(unit.device).T  # [..., D]
    assert rotation.signs is not None
    return walsh_hadamard(unit * rotation.signs.to(unit.device))


def unrotate(y: torch.Tensor, rotation: RotationOperand) -> torch.Tensor:
    """``u = R^T y`` for float32 rows ``[..., D]``."""
    if rotation.matrix is not None:
        return y @ rotation.matrix.to(y.device)  # [..., D]
    assert rotation.signs is not None
    return walsh_hadamard(y) * rotation.signs.to(y.device)


def unit_rows(rows: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """Float32 rows ``[N, D]`` divided by their norms ``[N]`` (floored at :data:`TINY`)."""
    return rows / norms.clamp_min(TINY).unsqueeze(-1)  # [N, D]


def encode(
    x: torch.Tensor, rotation: RotationOperand, thresholds: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[N, D]`` to packed codes (uint8 ``[ceil(N * D * bits / 8)]``) and float32 norms
    ``[N]``."""
    rows = x.to(torch.float32)  # [N, D]
    norms = vector_norms(rows)  # [N]
    rotated = rotate(unit_rows(rows, norms), rotation)  # [N, D]
    codes = torch.bucketize(rotated, thresholds.to(rows.device))  # [N, D]: thresholds < value
    return pack_bits(codes, bits), norms


def decode(
    packed: torch.Tensor,
    norms: torch.Tensor,
    rotation: RotationOperand,
    levels: torch.Tensor,
    bits: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Packed codes and norms ``[N]`` (float16 or float32) back to rows ``[N, D]`` of ``dtype``."""
    n_rows, dim = norms.shape[0], rotation_dim(rotation)
    codes = unpack_bits(packed, bits, n_rows * dim).reshape(n_rows, dim)  # [N, D]
    unit = unrotate(levels.to(packed.device)[codes.long()], rotation)  # [N, D]
    return (unit * norms.to(torch.float32).unsqueeze(-1)).to(dtype)  # [N, D]


def rotation_dim(rotation: RotationOperand) -> int:
    """``D``, the dimension the rotation acts on."""
    if rotation.matrix is not None:
        return int(rotation.matrix.shape[-1])
    assert rotation.signs is not None
    return int(rotation.signs.shape[0])

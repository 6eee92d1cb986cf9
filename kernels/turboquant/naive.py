"""TurboQuant_mse with the randomized Hadamard rotation: the torch reference and CPU path.

Motivation: the reference for the fused kernels in ``triton.py``, written as the plain sequence
of steps (TurboQuant, arXiv 2504.19874, Algorithm 1, fast variant): norm, normalise, random
signs, Walsh-Hadamard butterfly, scale by ``1/sqrt(d)``, Lloyd-Max bucket, bit-pack; and back:
unpack, codebook lookup, butterfly, scale, signs, norm.

It takes the codebook and the signs from a :class:`seqkv.quantizers.TurboQuantMSE` (nothing is
recomputed) and packs with :func:`seqkv.quantizers.pack_bits`, so its output is a valid
TurboQuantMSE payload.

Invariants:
1. The squared norm is a pairwise tree sum, its root correctly rounded, and ``1/sqrt(d)`` a
   float32 multiply: the same operations as the kernel, so codes equal the kernel's exactly
   (checked: ``tests/test_kernels_turboquant.py``).
2. Against :meth:`TurboQuantMSE.quantize` (whose norm uses ``torch.linalg.vector_norm`` and
   which divides by ``sqrt(d)``), a code can differ only where a rotated coordinate lies within
   float32 rounding of a threshold (checked: the same test bounds the count and the distance).
3. ``x`` is ``[N, D]`` with ``D`` a power of two (assumed; the op function checks).
"""

from __future__ import annotations

import math

import torch

from seqkv.quantizers import pack_bits, unpack_bits

from ..common.naive import butterfly, sqrt_rn, tree_sum

TINY = 1e-30
"""Floor on norms before dividing, as in :mod:`seqkv.quantizers.turboquant`."""


def inverse_sqrt_dim(dim: int) -> float:
    """``1 / sqrt(dim)``; both backends round it to float32 once."""
    return 1.0 / math.sqrt(dim)


def encode(
    x: torch.Tensor, signs: torch.Tensor, thresholds: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[N, D]`` to packed codes (uint8 ``[N * D * bits / 8]``) and float32 norms ``[N]``."""
    rows = x.to(torch.float32)  # [N, D]
    norms = sqrt_rn(tree_sum(rows * rows))  # [N]
    unit = rows / norms.clamp_min(TINY).unsqueeze(-1)  # [N, D]
    scale = torch.tensor(inverse_sqrt_dim(x.shape[-1]), dtype=torch.float32, device=x.device)
    rotated = butterfly(unit * signs) * scale  # [N, D]
    codes = torch.bucketize(rotated, thresholds)  # [N, D], the number of thresholds < value
    return pack_bits(codes, bits), norms


def decode(
    packed: torch.Tensor,
    norms: torch.Tensor,
    signs: torch.Tensor,
    levels: torch.Tensor,
    bits: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Packed codes and fp16 norms ``[N]`` back to rows ``[N, D]`` of ``dtype``."""
    dim = signs.shape[0]
    codes = unpack_bits(packed, bits, norms.shape[0] * dim).reshape(-1, dim)  # [N, D]
    scale = torch.tensor(inverse_sqrt_dim(dim), dtype=torch.float32, device=packed.device)
    unit = butterfly(levels[codes.long()]) * scale * signs  # [N, D]
    return (unit * norms.to(torch.float32).unsqueeze(-1)).to(dtype)  # [N, D]

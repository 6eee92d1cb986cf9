"""KIVI's group quantization (arXiv 2402.02750) of the non-window tokens: the torch reference.

Motivation: the reference for ``triton.py`` and the CPU path. It computes what
:meth:`seqkv.quantizers.KIVI.quantize` stores for the quantized head of a cache, ``[L, T_q, D]``
(``L`` = every leading dim flattened): per-group fp16 zero-points rounded down and scales rounded
up, ``code = round((x - zero) / scale)`` packed by :func:`seqkv.quantizers.pack_bits`, and back.
Keys group ``group_size`` consecutive tokens of one channel; values ``group_size`` consecutive
channels of one token.

Invariants:
1. Identical to the quantizer on CPU: codes, scales and zero-points equal exactly (checked:
   ``tests/test_kernels_kivi.py``).
2. Divisors are device tensors, never Python scalars. NOTE: torch on CUDA divides by a Python
   scalar as a multiplication by its reciprocal, which can differ by one ulp from the kernel's
   IEEE division; a tensor divisor keeps the reference exact on every device (enforced).
3. Scales and zero-points outside the fp16 range raise ``ValueError`` (enforced by
   :func:`seqkv.quantizers.base.round_down_fp16` / ``round_up_fp16``).
"""

from __future__ import annotations

import math

import torch

from seqkv.quantizers import KiviRole, pack_bits, unpack_bits
from seqkv.quantizers.base import round_down_fp16, round_up_fp16
from seqkv.quantizers.kivi import grouped


def _lanes(x: torch.Tensor, role: KiviRole) -> torch.Tensor:
    """``[L, T, D]`` to the layout whose last dim is grouped: keys ``[L, D, T]``, values as is."""
    return x.transpose(-1, -2) if role == "key" else x


def _expand(side: torch.Tensor, group_size: int, width: int) -> torch.Tensor:
    """Per-group values ``[L, A, nG]`` repeated over their group: ``[L, A, width]`` (float32)."""
    return side.to(torch.float32).repeat_interleave(group_size, dim=-1)[..., :width]


def quantize_head(
    head: torch.Tensor, role: KiviRole, group_size: int, bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[L, T_q, D]`` to (packed codes, fp16 scales, fp16 zero-points).

    Scales and zero-points: keys ``[L, ceil(T_q / G), D]``, values ``[L, T_q, ceil(D / G)]``.
    """
    lanes = _lanes(head.to(torch.float32), role)  # keys [L, D, T_q]; values [L, T_q, D]
    lo = grouped(lanes, group_size, math.inf).amin(dim=-1)  # [L, A, nG]
    hi = grouped(lanes, group_size, -math.inf).amax(dim=-1)  # [L, A, nG]
    levels = torch.tensor(float((1 << bits) - 1), dtype=torch.float32, device=head.device)
    zero = round_down_fp16(lo, "KIVI zero-point")
    scale = round_up_fp16((hi - zero.to(torch.float32)) / levels, "KIVI scale")
    width = lanes.shape[-1]
    zero_f, scale_f = _expand(zero, group_size, width), _expand(scale, group_size, width)
    safe = torch.where(scale_f > 0, scale_f, torch.ones_like(scale_f))
    codes = torch.round((lanes - zero_f) / safe).clamp_(0, (1 << bits) - 1)
    codes = torch.where(scale_f > 0, codes, torch.zeros_like(codes))
    packed = pack_bits(_lanes(codes, role).to(torch.uint8), bits)  # codes in [L, T_q, D] order
    return packed, _lanes(scale, role).contiguous(), _lanes(zero, role).contiguous()


def dequantize_head(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    shape: tuple[int, int, int],
    role: KiviRole,
    group_size: int,
    bits: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Inverse of :func:`quantize_head`: ``[L, T_q, D]`` of ``dtype``."""
    codes = unpack_bits(packed, bits, math.prod(shape)).reshape(shape)  # [L, T_q, D]
    lanes = _lanes(codes.to(torch.float32), role)  # grouped axis last
    width = lanes.shape[-1]
    scale = _expand(_lanes(scales, role), group_size, width)
    zero = _expand(_lanes(zeros, role), group_size, width)
    return _lanes(lanes * scale + zero, role).to(dtype)  # [L, T_q, D]

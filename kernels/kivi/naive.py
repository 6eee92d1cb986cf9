"""KIVI's group quantization (arXiv 2402.02750): the torch reference, and the CPU path of
:class:`seqkv.quantizers.KIVI`.

Motivation: the reference for ``triton.py``. It quantizes a cache head ``[L, T, D]`` (``L`` =
every leading dim flattened) in groups of ``group_size`` consecutive elements along one axis:
along tokens (KIVI's keys: one group is ``G`` tokens of one channel) or along channels (values:
``G`` channels of one token). Per group it stores an fp16 zero-point rounded down from the
minimum and an fp16 scale rounded up from ``(max - zero) / (2**b - 1)``, and the codes
``round((x - zero) / scale)`` packed by :func:`seqkv.kernels.common.bitpack.pack_bits`; and back.
A group cut short by the end of its axis forms a smaller last group.

Invariants:
1. Rounding the zero-point down and the scale up keeps every ``(x - zero) / scale`` within
   ``[0, 2**b - 1]`` up to float32 rounding, so the clamp changes no code by more than that
   (enforced; checked: ``tests/test_quantizers_kivi.py``, half-step error).
2. Divisors are device tensors, never Python scalars. NOTE: torch on CUDA divides by a Python
   scalar as a multiplication by its reciprocal, which can differ by one ulp from the kernel's
   IEEE division; a tensor divisor keeps the reference exact on every device (enforced).
3. Scales and zero-points outside the fp16 range raise ``ValueError`` (enforced by
   :func:`seqkv.kernels.common.naive.round_down_fp16` / ``round_up_fp16``).
4. Constant groups get scale 0 and code 0 and decode to their zero-point (enforced).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from ..common.bitpack import pack_bits, unpack_bits
from ..common.naive import round_down_fp16, round_up_fp16

GroupAxis = Literal["tokens", "channels"]
"""Which axis of ``[L, T, D]`` a group runs along: KIVI keys ``"tokens"``, values ``"channels"``."""


def side_shape(shape: tuple[int, int, int], axis: GroupAxis, group_size: int) -> tuple[int, ...]:
    """Shape of scales and zero-points for a head ``[L, T, D]``: ``[L, ceil(T / G), D]`` along
    tokens, ``[L, T, ceil(D / G)]`` along channels.

    >>> side_shape((2, 70, 64), "tokens", 32), side_shape((2, 70, 40), "channels", 32)
    ((2, 3, 64), (2, 70, 2))
    """
    n_lead, n_tokens, dim = shape
    if axis == "tokens":
        return (n_lead, -(-n_tokens // group_size), dim)
    return (n_lead, n_tokens, -(-dim // group_size))


def grouped(x: torch.Tensor, group_size: int, fill: float) -> torch.Tensor:
    """Split the last dim into groups ``[..., n_groups, group_size]``, padding with ``fill``."""
    n_groups = -(-x.shape[-1] // group_size)
    pad = n_groups * group_size - x.shape[-1]
    if pad:
        x = torch.cat([x, x.new_full((*x.shape[:-1], pad), fill)], dim=-1)
    return x.reshape(*x.shape[:-1], n_groups, group_size)  # [..., n_groups, G]


def _lanes(x: torch.Tensor, axis: GroupAxis) -> torch.Tensor:
    """``[L, T, D]`` to the layout whose last dim is grouped: tokens ``[L, D, T]``, else as is."""
    return x.transpose(-1, -2) if axis == "tokens" else x


def _expand(side: torch.Tensor, group_size: int, width: int) -> torch.Tensor:
    """Per-group values ``[L, A, nG]`` repeated over their group: ``[L, A, width]`` (float32)."""
    return side.to(torch.float32).repeat_interleave(group_size, dim=-1)[..., :width]


def quantize_head(
    head: torch.Tensor, axis: GroupAxis, group_size: int, bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[L, T, D]`` to (packed codes, fp16 scales, fp16 zero-points) of :func:`side_shape`."""
    lanes = _lanes(head.to(torch.float32), axis)  # tokens [L, D, T]; channels [L, T, D]
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
    packed = pack_bits(_lanes(codes, axis).to(torch.uint8), bits)  # codes in [L, T, D] order
    return packed, _lanes(scale, axis).contiguous(), _lanes(zero, axis).contiguous()


def dequantize_head(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    shape: tuple[int, int, int],
    axis: GroupAxis,
    group_size: int,
    bits: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Inverse of :func:`quantize_head`: ``[L, T, D]`` of ``dtype``."""
    codes = unpack_bits(packed, bits, math.prod(shape)).reshape(shape)  # [L, T, D]
    lanes = _lanes(codes.to(torch.float32), axis)  # grouped axis last
    width = lanes.shape[-1]
    scale = _expand(_lanes(scales, axis), group_size, width)
    zero = _expand(_lanes(zeros, axis), group_size, width)
    return _lanes(lanes * scale + zero, axis).to(dtype)  # [L, T, D]

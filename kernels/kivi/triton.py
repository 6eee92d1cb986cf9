"""KIVI group quantization in Triton: a statistics kernel, then a fused quantize + pack kernel.

Motivation: the reference (``naive.py``) pads, reshapes, reduces, repeats the scales over every
element and packs in separate passes. Here:

1. ``_stats_kernel``: one program per (leading index, group, block of lanes) reads its groups
   once, reduces min and max, and writes the fp16 zero-point (rounded down) and scale (rounded
   up) with exact float32 arithmetic (:func:`fp16_round_down`, :func:`fp16_round_up`).
2. ``_encode_kernel``: works on the packed stream directly. Program ``p`` owns ``BLOCK_WORDS``
   words of eight codes (``b`` bytes each) of the flattened ``[L, T_q, D]`` code array, so any
   shape packs correctly, including groups cut short and streams that do not end on a byte.
   Each code reads its element and its group's scale and zero-point, rounds half to even,
   clamps, and eight codes are packed into ``b`` bytes.
3. ``_decode_kernel``: the mirror image, writing ``codes * scale + zero`` in the output dtype.

The input is read twice (statistics, then codes); the second read usually hits L2.

Invariants:
1. Codes, scales and zero-points equal ``naive.quantize_head``'s exactly: exact min/max, IEEE
   division (``div_rn``), exact directed rounding, ties to even (enforced by construction;
   checked: ``tests/test_kernels_kivi.py``).
2. A scale or zero-point outside the fp16 range comes out of the statistics kernel as ``inf``,
   and :func:`quantize_head` raises the reference's ``InvalidTensorError`` before encoding
   (enforced).
3. Indices are int64, so tensors beyond 2**31 elements are addressed correctly (enforced).
"""

from __future__ import annotations

import torch

from .._jit import ENABLE_FP_FUSION, cdiv, kernel, next_power_of_2, tl
from ..common.naive import check_fp16_range
from ..common.triton import (
    downcast,
    fp16_round_down,
    fp16_round_up,
    pack_words,
    round_half_even,
    unpack_words,
    upcast,
)
from .naive import GroupAxis, side_shape

_BLOCK_WORDS = 128
"""Words of eight codes per program in the encode and decode kernels (1,024 codes)."""
_MAX_BLOCK_LANES = 64
"""Lanes (ungrouped axis) per program in the statistics kernel."""
_TILE = 4096
"""Elements of a statistics tile: ``GROUP_P2 x BLOCK_LANES`` (the op allows groups up to this)."""


@kernel
def _stats_kernel(
    x_ptr: tl.tensor,
    zero_ptr: tl.tensor,
    scale_ptr: tl.tensor,
    n_along: tl.int64,
    n_lanes: tl.int64,
    n_groups: tl.int64,
    x_stride_lead: tl.int64,
    x_stride_along: tl.int64,
    x_stride_lane: tl.int64,
    side_stride_lead: tl.int64,
    side_stride_group: tl.int64,
    side_stride_lane: tl.int64,
    group_size: tl.int64,
    LEVELS: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_LANES: tl.constexpr,
) -> None:
    """Groups run along axis ``along`` of a ``[L, along, lanes]`` view: ``[L, T, D]`` for groups
    along tokens, the transposed view ``[L, D, T]`` along channels; sides are
    ``[L, n_groups, lanes]`` views."""
    lead_group = tl.program_id(0).to(tl.int64)
    lead = lead_group // n_groups
    group = lead_group - lead * n_groups
    step = tl.arange(0, GROUP_P2).to(tl.int64)  # [G2]
    along = group * group_size + step
    lanes = tl.program_id(1).to(tl.int64) * BLOCK_LANES + tl.arange(0, BLOCK_LANES)  # [BL]
    along_ok = (step < group_size) & (along < n_along)
    lane_ok = lanes < n_lanes
    mask = along_ok[:, None] & lane_ok[None, :]  # [G2, BL]
    x = upcast(tl.load(x_ptr + lead * x_stride_lead + along[:, None] * x_stride_along
                       + lanes[None, :] * x_stride_lane, mask=mask, other=0.0), tl.float32)
    lo = tl.min(tl.where(mask, x, float("inf")), axis=0)  # [BL]
    hi = tl.max(tl.where(mask, x, -float("inf")), axis=0)  # [BL]
    zero = fp16_round_down(lo)
    scale = fp16_round_up(tl.div_rn(hi - zero, tl.full([BLOCK_LANES], LEVELS, tl.float32)))
    side = lead * side_stride_lead + group * side_stride_group + lanes * side_stride_lane
    tl.store(zero_ptr + side, zero.to(tl.float16), mask=lane_ok)
    tl.store(scale_ptr + side, scale.to(tl.float16), mask=lane_ok)


@kernel
def _encode_kernel(
    x_ptr: tl.tensor,
    zero_ptr: tl.tensor,
    scale_ptr: tl.tensor,
    packed_ptr: tl.tensor,
    n_codes: tl.int64,
    n_bytes: tl.int64,
    n_tokens: tl.int64,
    dim: tl.int64,
    x_stride_lead: tl.int64,
    x_stride_token: tl.int64,
    x_stride_dim: tl.int64,
    side_stride_lead: tl.int64,
    side_stride_token: tl.int64,
    side_stride_dim: tl.int64,
    group_tokens: tl.int64,
    group_dims: tl.int64,
    BITS: tl.constexpr,
    BLOCK_WORDS: tl.constexpr,
) -> None:
    word = tl.program_id(0).to(tl.int64) * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)  # [W]
    lane = tl.arange(0, 8).to(tl.int64)  # [8]
    flat = word[:, None] * 8 + lane[None, :]  # [W, 8]: index into [L, T_q, D]
    valid = flat < n_codes
    lead = flat // (n_tokens * dim)
    token = (flat // dim) % n_tokens
    channel = flat % dim
    x = upcast(tl.load(x_ptr + lead * x_stride_lead + token * x_stride_token
                       + channel * x_stride_dim, mask=valid, other=0.0), tl.float32)
    side = (lead * side_stride_lead + (token // group_tokens) * side_stride_token
            + (channel // group_dims) * side_stride_dim)
    zero = tl.load(zero_ptr + side, mask=valid, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + side, mask=valid, other=0.0).to(tl.float32)
    levels = (1 << BITS) - 1
    safe = tl.where(scale > 0, scale, 1.0)
    # NOTE: clamping before rounding keeps round_half_even's argument small; clamping again
    # after gives exactly torch.round(v).clamp(0, levels).
    ratio = tl.minimum(tl.maximum(tl.div_rn(x - zero, safe), -1.0), levels + 1.0)
    codes = tl.minimum(tl.maximum(round_half_even(ratio), 0.0), levels * 1.0)
    codes = tl.where(valid & (scale > 0), codes, 0.0).to(tl.int64)
    octets = pack_words(codes, BITS)  # [W, 8]
    byte = word[:, None] * BITS + lane[None, :]
    tl.store(packed_ptr + byte, octets.to(tl.uint8), mask=(lane[None, :] < BITS) & (byte < n_bytes))


@kernel
def _decode_kernel(
    packed_ptr: tl.tensor,
    zero_ptr: tl.tensor,
    scale_ptr: tl.tensor,
    out_ptr: tl.tensor,
    n_codes: tl.int64,
    n_bytes: tl.int64,
    n_tokens: tl.int64,
    dim: tl.int64,
    out_stride_lead: tl.int64,
    out_stride_token: tl.int64,
    out_stride_dim: tl.int64,
    side_stride_lead: tl.int64,
    side_stride_token: tl.int64,
    side_stride_dim: tl.int64,
    group_tokens: tl.int64,
    group_dims: tl.int64,
    BITS: tl.constexpr,
    BLOCK_WORDS: tl.constexpr,
) -> None:
    word = tl.program_id(0).to(tl.int64) * BLOCK_WORDS + tl.arange(0, BLOCK_WORDS)  # [W]
    lane = tl.arange(0, 8).to(tl.int64)  # [8]
    byte = word[:, None] * BITS + lane[None, :]
    octets = tl.load(packed_ptr + byte, mask=(lane[None, :] < BITS) & (byte < n_bytes),
                     other=0).to(tl.int64)
    codes = unpack_words(octets, BITS).to(tl.float32)  # [W, 8]
    flat = word[:, None] * 8 + lane[None, :]  # [W, 8]
    valid = flat < n_codes
    lead = flat // (n_tokens * dim)
    token = (flat // dim) % n_tokens
    channel = flat % dim
    side = (lead * side_stride_lead + (token // group_tokens) * side_stride_token
            + (channel // group_dims) * side_stride_dim)
    zero = tl.load(zero_ptr + side, mask=valid, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + side, mask=valid, other=0.0).to(tl.float32)
    out = codes * scale + zero
    tl.store(out_ptr + lead * out_stride_lead + token * out_stride_token
             + channel * out_stride_dim, downcast(out, out_ptr.dtype.element_ty), mask=valid)


def _check_side_range(scales: torch.Tensor, zeros: torch.Tensor) -> None:
    """The statistics kernel marks fp16 overflow with inf; raise what the quantizer raises."""
    for values, what in ((zeros, "KIVI zero-point"), (scales, "KIVI scale")):
        check_fp16_range(values, what)


def _group_steps(axis: GroupAxis, group_size: int) -> tuple[int, int]:
    """(tokens, channels) per group: along tokens ``(G, 1)``, along channels ``(1, G)``."""
    return (group_size, 1) if axis == "tokens" else (1, group_size)


def quantize_head(
    head: torch.Tensor,
    axis: GroupAxis,
    group_size: int,
    bits: int,
    *,
    packed: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    zeros: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel twin of ``naive.quantize_head``; outputs may be given pre-allocated."""
    n_lead, n_tokens, dim = head.shape
    sides = side_shape((n_lead, n_tokens, dim), axis, group_size)
    n_codes = n_lead * n_tokens * dim
    n_bytes = (n_codes * bits + 7) // 8
    device = head.device
    if packed is None:
        packed = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    if scales is None:
        scales = torch.empty(sides, dtype=torch.float16, device=device)
    if zeros is None:
        zeros = torch.empty(sides, dtype=torch.float16, device=device)
    if n_codes == 0:
        return packed, scales, zeros
    hs = head.stride()
    ss = scales.stride()
    if axis == "tokens":  # view [L, T, D], sides [L, nG, D]
        n_along, n_lanes, x_strides, side_strides = n_tokens, dim, hs, ss
    else:  # along channels: view [L, D, T], sides [L, T, nG] seen as [L, nG, T]
        n_along, n_lanes = dim, n_tokens
        x_strides = (hs[0], hs[2], hs[1])
        side_strides = (ss[0], ss[2], ss[1])
    n_groups = cdiv(n_along, group_size)
    group_p2 = next_power_of_2(group_size)
    block_lanes = max(1, min(_MAX_BLOCK_LANES, next_power_of_2(n_lanes), _TILE // group_p2))
    _stats_kernel[(n_lead * n_groups, cdiv(n_lanes, block_lanes))](
        head, zeros, scales, n_along, n_lanes, n_groups, *x_strides, *side_strides, group_size,
        LEVELS=(1 << bits) - 1, GROUP_P2=group_p2, BLOCK_LANES=block_lanes,
        enable_fp_fusion=ENABLE_FP_FUSION,
    )
    _check_side_range(scales, zeros)
    _encode_kernel[(cdiv(cdiv(n_codes, 8), _BLOCK_WORDS),)](
        head, zeros, scales, packed, n_codes, n_bytes, n_tokens, dim, *hs, *ss,
        *_group_steps(axis, group_size), BITS=bits, BLOCK_WORDS=_BLOCK_WORDS,
        enable_fp_fusion=ENABLE_FP_FUSION,
    )
    return packed, scales, zeros


def dequantize_head(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    shape: tuple[int, int, int],
    axis: GroupAxis,
    group_size: int,
    bits: int,
    dtype: torch.dtype,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Kernel twin of ``naive.dequantize_head``; ``out`` (``[L, T_q, D]``) may be given."""
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=packed.device)
    n_codes = shape[0] * shape[1] * shape[2]
    if n_codes == 0:
        return out
    scales, zeros = scales.contiguous(), zeros.contiguous()
    _decode_kernel[(cdiv(cdiv(n_codes, 8), _BLOCK_WORDS),)](
        packed, zeros, scales, out, n_codes, packed.numel(), shape[1], shape[2], *out.stride(),
        *scales.stride(), *_group_steps(axis, group_size), BITS=bits, BLOCK_WORDS=_BLOCK_WORDS,
        enable_fp_fusion=ENABLE_FP_FUSION,
    )
    return out

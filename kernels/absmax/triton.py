"""Per-vector absmax int8 / fp8 (e4m3) quantization as one Triton kernel each way.

Motivation: the reference (``naive.py``) makes about eight passes (abs, max, divide, round the
scale, divide, clamp, convert, view). Here one program loads a tile of ``BLOCK_ROWS`` whole
vectors once, reduces the absmax, rounds the fp16 scale up, and writes the scale and the codes;
dequantizing reads the codes and scale once and writes the output dtype.

The fp8 e4m3 conversion is done by hand from IEEE operations: the magnitude is scaled by the
power of two that puts its last representable bit at the units place, rounded half to even,
scaled back (both scalings exact), and the byte assembled from the float32 exponent and top
three mantissa bits (subnormal codes ``m * 2**-9`` below ``2**-6``). NOTE: Triton's own
``float8e4nv`` conversion exists only on some GPUs and not on the CPU interpreter; the manual
form runs everywhere and matches torch's rounding bit for bit (checked).

Invariants:
1. Codes and scales equal ``naive.quantize``'s exactly, decoded values ``naive.dequantize``'s
   exactly: exact max, IEEE division (``div_rn``), exact directed fp16 rounding, ties to even,
   no FMA contraction (enforced by construction; checked: ``tests/test_kernels_absmax.py``).
2. A scale beyond the fp16 range comes out of the kernel as ``inf`` and :func:`quantize` raises
   the reference's ``InvalidTensorError`` (enforced).
3. ``D <= 4096`` (a tile holds whole vectors; checked by the op function, which falls back to
   the reference under ``"auto"``).
"""

from __future__ import annotations

import torch

from .._jit import ENABLE_FP_FUSION, cdiv, device, kernel, next_power_of_2, tl
from ..common.naive import check_fp16_range
from ..common.triton import downcast, fp16_round_up, round_half_even, upcast
from .naive import AbsmaxFormat, qmax

_TILE_ELEMENTS = 4096
"""Elements per program: ``BLOCK_ROWS = _TILE_ELEMENTS / BLOCK_DIM`` vectors."""


@device
def _fp8_e4m3_byte(v: tl.tensor) -> tl.tensor:
    """The e4m3fn byte of float32 ``v`` (``|v| <= 448``), rounded to nearest even, as int32."""
    magnitude = tl.abs(v)
    exponent = ((magnitude.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, -6)  # below 2**-6 the spacing is the subnormal 2**-9
    quantum = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2**(e - 3)
    inverse = ((3 - exponent + 127) << 23).to(tl.float32, bitcast=True)  # 2**(3 - e)
    rounded = round_half_even(magnitude * inverse) * quantum
    bits = rounded.to(tl.int32, bitcast=True)
    normal = (((((bits >> 23) & 0xFF) - 127 + 7) << 3) | ((bits >> 20) & 7))
    subnormal = (rounded * 512.0).to(tl.int32)  # m * 2**-9, m in 0..8 (8 is 2**-6, also normal)
    byte = tl.where(rounded >= 0.015625, normal, subnormal)
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
    return byte | (sign << 7)


@device
def _fp8_e4m3_value(byte: tl.tensor) -> tl.tensor:
    """The float32 value of an e4m3fn byte (int32 in 0..255); NaN for ``0x7F`` / ``0xFF``."""
    sign = (byte >> 7) & 1
    exponent = (byte >> 3) & 0xF
    mantissa = byte & 7
    normal = ((sign << 31) | ((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32,
                                                                             bitcast=True)
    subnormal = mantissa.to(tl.float32) * 0.001953125  # 2**-9
    subnormal = tl.where(sign == 1, -subnormal, subnormal)
    value = tl.where(exponent == 0, subnormal, normal)
    return tl.where((byte & 0x7F) == 0x7F, float("nan"), value)


@kernel
def _quantize_kernel(
    x_ptr: tl.tensor,
    codes_ptr: tl.tensor,
    scales_ptr: tl.tensor,
    n_rows: tl.int64,
    dim: tl.int64,
    row_stride: tl.int64,
    QMAX: tl.constexpr,
    FP8: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
) -> None:
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [R]
    cols = tl.arange(0, BLOCK_DIM).to(tl.int64)  # [Dp]
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < dim)[None, :]  # [R, Dp]
    x = upcast(tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :], mask=mask,
                       other=0.0), tl.float32)
    absmax = tl.max(tl.abs(x), axis=1)  # [R], exact
    scale = fp16_round_up(tl.div_rn(absmax, tl.full([BLOCK_ROWS], QMAX, tl.float32)))
    tl.store(scales_ptr + rows, scale.to(tl.float16), mask=row_ok)
    safe = tl.where(scale > 0, scale, 1.0)
    scaled = tl.minimum(tl.maximum(tl.div_rn(x, safe[:, None]), -QMAX), QMAX)  # [R, Dp]
    if FP8:  # noqa: SIM108 (a static branch on a constexpr, resolved when the kernel compiles)
        byte = _fp8_e4m3_byte(scaled)
    else:
        byte = round_half_even(scaled).to(tl.int32) & 0xFF
    tl.store(codes_ptr + rows[:, None] * dim + cols[None, :], byte.to(tl.uint8), mask=mask)


@kernel
def _dequantize_kernel(
    codes_ptr: tl.tensor,
    scales_ptr: tl.tensor,
    out_ptr: tl.tensor,
    n_rows: tl.int64,
    dim: tl.int64,
    FP8: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
) -> None:
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [R]
    cols = tl.arange(0, BLOCK_DIM).to(tl.int64)  # [Dp]
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < dim)[None, :]  # [R, Dp]
    offsets = rows[:, None] * dim + cols[None, :]
    codes = tl.load(codes_ptr + offsets, mask=mask, other=0)  # [R, Dp] uint8
    if FP8:
        values = _fp8_e4m3_value(codes.to(tl.int32))
    else:
        values = codes.to(tl.int8, bitcast=True).to(tl.float32)
    scale = tl.load(scales_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)  # [R]
    out = values * scale[:, None]
    tl.store(out_ptr + offsets, downcast(out, out_ptr.dtype.element_ty), mask=mask)


def _blocks(dim: int) -> tuple[int, int]:
    block_dim = next_power_of_2(dim)
    return max(1, _TILE_ELEMENTS // block_dim), block_dim


def quantize(
    x: torch.Tensor,
    fmt: AbsmaxFormat,
    *,
    codes: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of ``naive.quantize``; ``codes`` / ``scales`` may be given pre-allocated."""
    n_rows, dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if codes is None:
        codes = torch.empty(n_rows * dim, dtype=torch.uint8, device=x.device)
    if scales is None:
        scales = torch.empty(n_rows, dtype=torch.float16, device=x.device)
    if n_rows:
        block_rows, block_dim = _blocks(dim)
        _quantize_kernel[(cdiv(n_rows, block_rows),)](
            x, codes, scales, n_rows, dim, x.stride(0), QMAX=qmax(fmt), FP8=fmt == "fp8_e4m3",
            BLOCK_ROWS=block_rows, BLOCK_DIM=block_dim, enable_fp_fusion=ENABLE_FP_FUSION,
        )
        check_fp16_range(scales, "absmax scale")
    return codes, scales


def dequantize(
    codes: torch.Tensor,
    scales: torch.Tensor,
    dim: int,
    fmt: AbsmaxFormat,
    dtype: torch.dtype,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Kernel twin of ``naive.dequantize``; ``out`` (``[N, D]``, contiguous) may be given."""
    n_rows = scales.shape[0]
    if out is None:
        out = torch.empty(n_rows, dim, dtype=dtype, device=codes.device)
    if n_rows and dim:
        block_rows, block_dim = _blocks(dim)
        _dequantize_kernel[(cdiv(n_rows, block_rows),)](
            codes, scales.contiguous(), out, n_rows, dim, FP8=fmt == "fp8_e4m3",
            BLOCK_ROWS=block_rows, BLOCK_DIM=block_dim, enable_fp_fusion=ENABLE_FP_FUSION,
        )
    return out

"""The KV residual's uniform quantizer and its inverse as single-pass elementwise kernels.

Motivation: the reference (``naive.py``) makes about a dozen full-size passes (two float64
copies, a division, rounding, clamping, the rebuild, two comparisons, two selects). Each kernel
here reads its inputs once and writes its outputs once: 8 bytes in and 8 out per element for
``quantize`` (float32 inputs), 8 in and 4 out for ``dequantize``.

Invariants:
1. Outputs equal ``naive.quantize`` / ``naive.dequantize`` exactly: the same float64 ratio with
   IEEE division, ties to even (clamped first, which gives the same result), the float32 rebuild
   without FMA contraction, the same comparisons (enforced by construction; checked:
   ``tests/test_kernels_residual.py``).
2. The float64 step and the tolerance are read from a float64 tensor, so no launch argument is
   rounded to float32 on the way in (enforced).
"""

from __future__ import annotations

import torch

from seqkv.coding.residual import ALPHABET_LIMIT

from .._jit import ENABLE_FP_FUSION, cdiv, kernel, tl
from ..common.triton import round_half_even, upcast
from .naive import ESCAPE

_BLOCK = 1024
_LIMIT = tl.constexpr(ALPHABET_LIMIT)
_ESCAPE = tl.constexpr(ESCAPE)


@kernel
def _quantize_kernel(
    target_ptr: tl.tensor,
    prediction_ptr: tl.tensor,
    constants_ptr: tl.tensor,
    symbols_ptr: tl.tensor,
    rebuilt_ptr: tl.tensor,
    n: tl.int64,
    BLOCK: tl.constexpr,
) -> None:
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offsets < n
    target = upcast(tl.load(target_ptr + offsets, mask=valid, other=0.0), tl.float32)
    prediction = upcast(tl.load(prediction_ptr + offsets, mask=valid, other=0.0), tl.float32)
    step = tl.load(constants_ptr)  # float64: 2 * tolerance
    tolerance = tl.load(constants_ptr + 1).to(tl.float32)
    # NOTE: float64 division with `/` is IEEE round-to-nearest on every backend (only float32
    # division needs div_rn).
    ratio = (target.to(tl.float64) - prediction.to(tl.float64)) / step
    ratio = tl.minimum(tl.maximum(ratio, -_LIMIT - 1.0), _LIMIT + 1.0)
    symbols = tl.minimum(tl.maximum(round_half_even(ratio), -_LIMIT * 1.0), _LIMIT * 1.0)
    symbols = symbols.to(tl.int32)
    rebuilt = prediction + symbols.to(tl.float32) * step.to(tl.float32)
    escaped = (tl.abs(symbols) >= _LIMIT) | (tl.abs(rebuilt - target) > tolerance)
    tl.store(symbols_ptr + offsets, tl.where(escaped, _ESCAPE, symbols), mask=valid)
    tl.store(rebuilt_ptr + offsets, tl.where(escaped, target, rebuilt), mask=valid)


@kernel
def _dequantize_kernel(
    prediction_ptr: tl.tensor,
    symbols_ptr: tl.tensor,
    constants_ptr: tl.tensor,
    out_ptr: tl.tensor,
    n: tl.int64,
    BLOCK: tl.constexpr,
) -> None:
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offsets < n
    prediction = upcast(tl.load(prediction_ptr + offsets, mask=valid, other=0.0), tl.float32)
    symbols = tl.load(symbols_ptr + offsets, mask=valid, other=0)
    inliers = tl.where(symbols == _ESCAPE, 0, symbols)
    step = tl.load(constants_ptr).to(tl.float32)
    tl.store(out_ptr + offsets, prediction + inliers.to(tl.float32) * step, mask=valid)


def _constants(tolerance: float, device: torch.device) -> torch.Tensor:
    return torch.tensor([2.0 * tolerance, tolerance], dtype=torch.float64, device=device)


def quantize(
    target: torch.Tensor,
    prediction: torch.Tensor,
    tolerance: float,
    *,
    symbols: torch.Tensor | None = None,
    rebuilt: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of ``naive.quantize``; outputs may be given pre-allocated (contiguous)."""
    target, prediction = target.contiguous(), prediction.contiguous()
    if symbols is None:
        symbols = torch.empty(target.shape, dtype=torch.int32, device=target.device)
    if rebuilt is None:
        rebuilt = torch.empty(target.shape, dtype=torch.float32, device=target.device)
    n = target.numel()
    if n:
        _quantize_kernel[(cdiv(n, _BLOCK),)](
            target, prediction, _constants(tolerance, target.device), symbols, rebuilt, n,
            BLOCK=_BLOCK, enable_fp_fusion=ENABLE_FP_FUSION,
        )
    return symbols, rebuilt


def dequantize(
    prediction: torch.Tensor,
    symbols: torch.Tensor,
    tolerance: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Kernel twin of ``naive.dequantize``; ``out`` may be given pre-allocated (contiguous)."""
    prediction, symbols = prediction.contiguous(), symbols.contiguous()
    if out is None:
        out = torch.empty(prediction.shape, dtype=torch.float32, device=prediction.device)
    n = prediction.numel()
    if n:
        _dequantize_kernel[(cdiv(n, _BLOCK),)](
            prediction, symbols, _constants(tolerance, prediction.device), out, n,
            BLOCK=_BLOCK, enable_fp_fusion=ENABLE_FP_FUSION,
        )
    return out

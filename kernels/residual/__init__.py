"""The KV residual quantizer (``target - prediction`` at a uniform step of twice the tolerance)
and its inverse, as kernels.

Motivation: the residual is the one part of seqkv's encoder and decoder that touches every KV
component. :mod:`seqkv.coding.residual` computes it in torch, then entropy-codes the symbols on
the CPU; these functions are that elementwise step, fused, for caches that live on a GPU.

Invariants:
1. The arithmetic and escape rule are ``seqkv.coding.residual``'s (checked:
   ``tests/test_kernels_residual.py``).
2. Both backends agree exactly (checked: same tests under the interpreter; on a GPU by
   ``scripts/gpu_check.sh``).
3. Only the quantized mode (``tolerance > 0``) is implemented; the bit-exact mode stays in
   ``seqkv.coding.residual`` (enforced: ``ValueError``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..dispatch import KernelBackend, resolve_backend
from . import naive
from .naive import ESCAPE

__all__ = ["ESCAPE", "QuantizedResidual", "residual_dequantize", "residual_quantize"]


@dataclass(frozen=True, eq=False)
class QuantizedResidual:
    """Symbols of a residual and the tensor a decoder will rebuild from them."""

    symbols: torch.Tensor
    """int32, the target's shape; ``ESCAPE`` marks an element stored verbatim."""
    rebuilt: torch.Tensor
    """float32: ``prediction + symbol * float32(2 t)``, or the target where escaped."""

    @property
    def num_escapes(self) -> int:
        return int((self.symbols == ESCAPE).sum())


def _check_tolerance(tolerance: float) -> None:
    if not (tolerance > 0 and math.isfinite(tolerance)):
        raise ValueError(
            f"tolerance must be a finite number > 0, got {tolerance}; the bit-exact mode "
            "(tolerance 0) is seqkv.coding.residual.encode_residual's"
        )


def residual_quantize(
    target: torch.Tensor,
    prediction: torch.Tensor,
    tolerance: float,
    *,
    backend: KernelBackend | None = None,
) -> QuantizedResidual:
    """Quantize ``target - prediction`` with step ``2 * tolerance`` (float inputs, same shape).

    >>> r = residual_quantize(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0]), 0.1,
    ...                       backend="torch")
    >>> r.symbols.tolist()
    [0, 2]
    """
    _check_tolerance(tolerance)
    if target.shape != prediction.shape:
        raise ValueError(
            f"target {tuple(target.shape)} and prediction {tuple(prediction.shape)} must have "
            "the same shape"
        )
    if not (target.dtype.is_floating_point and prediction.dtype.is_floating_point):
        raise TypeError(f"expected floating-point tensors, got {target.dtype}, {prediction.dtype}")
    if target.numel() and not bool(torch.isfinite(target).all()):
        raise ValueError("the target holds NaN or infinite values")
    if resolve_backend(backend, target, prediction) == "triton":
        from .triton import quantize as quantize_kernel

        symbols, rebuilt = quantize_kernel(target, prediction, tolerance)
    else:
        symbols, rebuilt = naive.quantize(target, prediction, tolerance)
    return QuantizedResidual(symbols=symbols, rebuilt=rebuilt)


def residual_dequantize(
    prediction: torch.Tensor,
    symbols: torch.Tensor,
    tolerance: float,
    *,
    backend: KernelBackend | None = None,
) -> torch.Tensor:
    """``prediction + symbols * float32(2 * tolerance)``; escaped elements get the prediction,
    and the caller writes their stored values over them."""
    _check_tolerance(tolerance)
    if symbols.shape != prediction.shape or symbols.dtype != torch.int32:
        raise ValueError(
            f"symbols must be int32 of the prediction's shape {tuple(prediction.shape)}, got "
            f"{symbols.dtype} {tuple(symbols.shape)}"
        )
    if resolve_backend(backend, prediction, symbols) == "triton":
        from .triton import dequantize as dequantize_kernel

        return dequantize_kernel(prediction, symbols, tolerance)
    return naive.dequantize(prediction, symbols, tolerance)

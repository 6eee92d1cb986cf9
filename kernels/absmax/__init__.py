"""Per-vector absmax quantization to 8-bit codes (int8 or fp8 e4m3) with an fp16 scale, as ops.

Motivation: :class:`seqkv.quantizers.Int8Absmax` and :class:`seqkv.quantizers.FP8E4M3` call
these two functions for every quantize and dequantize: the reference (``naive.py``) is their CPU
path and the kernels (``triton.py``) their GPU path.

Invariants:
1. Both backends return identical codes and scales, and identical decoded values (checked:
   ``tests/test_kernels_absmax.py`` on Triton's interpreter, ``scripts/gpu_check.sh`` on a GPU).
2. A scale beyond the fp16 range raises ``InvalidTensorError`` on both backends (enforced).
3. Vectors longer than 4,096 components run the reference under ``"auto"`` and raise
   :class:`~seqkv.kernels.dispatch.UnsupportedKernelInputError` when Triton is forced (enforced).
"""

from __future__ import annotations

import torch

from seqkv.errors import InvalidTensorError, QuantizerConfigError

from ..dispatch import KernelBackend, resolve_backend
from . import naive
from .naive import AbsmaxFormat, qmax

__all__ = ["AbsmaxFormat", "absmax_dequantize", "absmax_quantize", "qmax"]

_KERNEL_MAX_DIM = 4096
_FORMATS: tuple[AbsmaxFormat, ...] = ("int8", "fp8_e4m3")


def _kernel_unsupported(dim: int) -> str | None:
    if dim > _KERNEL_MAX_DIM:
        return f"vectors of {dim} components exceed {_KERNEL_MAX_DIM}; use backend='torch'"
    return None


def _check_format(fmt: AbsmaxFormat) -> None:
    if fmt not in _FORMATS:
        raise QuantizerConfigError(f"fmt must be one of {', '.join(_FORMATS)}, got {fmt!r}")


def absmax_quantize(
    x: torch.Tensor, fmt: AbsmaxFormat, *, backend: KernelBackend | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[N, D]`` to 8-bit codes (uint8 ``[N * D]``, row-major) and fp16 scales ``[N]``.

    >>> codes, scales = absmax_quantize(torch.tensor([[127.0, -63.5, 0.0, 1.0]]), "int8")
    >>> codes.view(torch.int8).tolist(), scales.tolist()
    ([127, -64, 0, 1], [1.0])
    """
    _check_format(fmt)
    if x.dim() != 2 or not x.dtype.is_floating_point:
        raise InvalidTensorError(
            f"expected floating-point rows [N, D], got {x.dtype} {tuple(x.shape)}"
        )
    chosen = resolve_backend(backend, x, unsupported=_kernel_unsupported(x.shape[1]))
    if chosen == "triton":
        # NOTE: imported here, after dispatch chose Triton: importing seqkv.kernels must not
        # import triton (seqkv.kernels.dispatch, invariant 1).
        from . import triton as kernel

        return kernel.quantize(x, fmt)
    return naive.quantize(x, fmt)


def absmax_dequantize(
    codes: torch.Tensor,
    scales: torch.Tensor,
    dim: int,
    fmt: AbsmaxFormat,
    dtype: torch.dtype,
    *,
    backend: KernelBackend | None = None,
) -> torch.Tensor:
    """Codes ``[N * D]`` and scales ``[N]`` back to rows ``[N, D]`` of ``dtype``."""
    _check_format(fmt)
    if scales.dim() != 1 or codes.dtype != torch.uint8 or codes.shape != (scales.shape[0] * dim,):
        raise InvalidTensorError(
            f"{scales.shape[0]} vectors of {dim} components need uint8 codes of shape "
            f"({scales.shape[0] * dim},) and 1-D scales; got {codes.dtype} "
            f"{tuple(codes.shape)} and {tuple(scales.shape)}"
        )
    chosen = resolve_backend(backend, codes, unsupported=_kernel_unsupported(dim))
    if chosen == "triton":
        from . import triton as kernel

        return kernel.dequantize(codes, scales, dim, fmt, dtype)
    return naive.dequantize(codes, scales, dim, fmt, dtype)

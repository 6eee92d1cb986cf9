"""KIVI (arXiv 2402.02750): group quantize + bit-pack, and unpack + dequantize, as ops.

Motivation: KIVI is a baseline seqkv is measured against, and :class:`seqkv.quantizers.KIVI`
calls these two functions for every quantize and dequantize: the reference (``naive.py``) is its
CPU path and the kernels (``triton.py``) its GPU path. The ops see only the quantized head of a
cache, ``[L, T, D]``; the quantizer splits off its full-precision window and owns the stored
format.

Invariants:
1. Both backends return identical codes, scales and zero-points, and identical decoded values
   (checked: ``tests/test_kernels_kivi.py`` on Triton's interpreter, ``scripts/gpu_check.sh``
   on a GPU).
2. A scale or zero-point beyond the fp16 range raises ``InvalidTensorError`` on both backends
   (enforced).
3. Groups longer than a kernel tile (4,096) run the reference under ``"auto"`` and raise
   :class:`~seqkv.kernels.dispatch.UnsupportedKernelInputError` when Triton is forced (enforced).
"""

from __future__ import annotations

import math

import torch

from seqkv.errors import InvalidTensorError, QuantizerConfigError

from ..common.bitpack import check_bits, packed_nbytes
from ..dispatch import KernelBackend, resolve_backend
from . import naive
from .naive import GroupAxis, side_shape

__all__ = ["GroupAxis", "kivi_dequantize", "kivi_quantize", "side_shape"]

_KERNEL_MAX_GROUP = 4096
"""The statistics kernel holds a whole group (padded to a power of two) in one tile."""

_AXES: tuple[GroupAxis, ...] = ("tokens", "channels")


def _kernel_unsupported(group_size: int) -> str | None:
    if group_size > _KERNEL_MAX_GROUP:
        return f"group_size={group_size} exceeds {_KERNEL_MAX_GROUP}; use backend='torch'"
    return None


def _check_config(axis: GroupAxis, group_size: int, bits: int) -> None:
    check_bits(bits)
    if axis not in _AXES:
        raise QuantizerConfigError(f"axis must be 'tokens' or 'channels', got {axis!r}")
    if group_size < 1:
        raise QuantizerConfigError(f"group_size must be positive, got {group_size}")


def kivi_quantize(
    head: torch.Tensor,
    axis: GroupAxis,
    group_size: int,
    bits: int,
    *,
    backend: KernelBackend | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A head ``[L, T, D]`` to packed ``bits``-bit codes (in ``[L, T, D]`` order), fp16 scales
    and fp16 zero-points, both of :func:`side_shape`.

    >>> packed, scales, zeros = kivi_quantize(torch.randn(3, 10, 8), "channels", 4, 2)
    >>> packed.numel(), tuple(scales.shape), zeros.dtype
    (60, (3, 10, 2), torch.float16)
    """
    _check_config(axis, group_size, bits)
    if head.dim() != 3 or not head.dtype.is_floating_point:
        raise InvalidTensorError(f"expected a floating-point head [L, T, D], got {head.dtype} "
                                 f"{tuple(head.shape)}")
    chosen = resolve_backend(backend, head, unsupported=_kernel_unsupported(group_size))
    if chosen == "triton":
        # NOTE: imported here, after dispatch chose Triton: importing seqkv.kernels must not
        # import triton (seqkv.kernels.dispatch, invariant 1).
        from . import triton as kernel

        return kernel.quantize_head(head, axis, group_size, bits)
    return naive.quantize_head(head, axis, group_size, bits)


def kivi_dequantize(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    shape: tuple[int, int, int],
    axis: GroupAxis,
    group_size: int,
    bits: int,
    dtype: torch.dtype,
    *,
    backend: KernelBackend | None = None,
) -> torch.Tensor:
    """Inverse of :func:`kivi_quantize`: the head ``shape = (L, T, D)`` in ``dtype``."""
    _check_config(axis, group_size, bits)
    sides = side_shape(shape, axis, group_size)
    if tuple(scales.shape) != sides or tuple(zeros.shape) != sides:
        raise InvalidTensorError(
            f"scales and zero-points of a {shape} head grouped along {axis} by {group_size} "
            f"must have shape {sides}, got {tuple(scales.shape)} and {tuple(zeros.shape)}"
        )
    need = packed_nbytes(math.prod(shape), bits)
    if packed.dtype != torch.uint8 or packed.shape != (need,):
        raise InvalidTensorError(f"{math.prod(shape)} {bits}-bit codes need {need} packed bytes "
                                 f"(uint8), got {packed.dtype} {tuple(packed.shape)}")
    chosen = resolve_backend(backend, packed, unsupported=_kernel_unsupported(group_size))
    if chosen == "triton":
        from . import triton as kernel

        return kernel.dequantize_head(packed, scales, zeros, shape, axis, group_size, bits,
                                      dtype)
    return naive.dequantize_head(packed, scales, zeros, shape, axis, group_size, bits, dtype)

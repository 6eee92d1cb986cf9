"""KIVI (arXiv 2402.02750): group quantize + bit-pack and unpack + dequantize as kernels.

Motivation: KIVI is a baseline seqkv is measured against; these functions run what
:class:`seqkv.quantizers.KIVI` stores, on the GPU when the cache is there. They take the
quantizer itself and return or accept its :class:`seqkv.quantizers.QuantizedTensor`, so the
kernel's output decodes with ``quantizer.dequantize`` and the quantizer's with
:func:`kivi_dequantize`.

The full-precision window (the last tokens, see ``KIVI.dense_tokens``) is split off and stored in
16-bit floating point by torch on both backends; the kernels handle the quantized head.

Invariants:
1. On CPU, :func:`kivi_quantize` returns exactly ``quantizer.quantize(x)``'s codes, scales,
   zero-points and window, on either backend (checked: ``tests/test_kernels_kivi.py``).
2. Both backends agree exactly on codes, scales and zero-points on every device (checked: the
   same tests on the interpreter, ``scripts/gpu_check.sh`` on a GPU).
3. Bad input raises what the quantizer raises (enforced: the quantizer's own checks run first).
"""

from __future__ import annotations

import math

import torch

from seqkv.quantizers import KIVI, PackedCodes, QuantizedTensor
from seqkv.quantizers.base import check_code_bits, check_input, check_owner
from seqkv.quantizers.kivi import window_dtype

from ..dispatch import KernelBackend, resolve_backend
from . import naive

__all__ = ["kivi_dequantize", "kivi_quantize"]

_KERNEL_MAX_GROUP = 4096
"""The statistics kernel holds a whole group (padded to a power of two) in one tile."""


def _kernel_unsupported(group_size: int) -> str | None:
    if group_size > _KERNEL_MAX_GROUP:
        return f"group_size={group_size} exceeds {_KERNEL_MAX_GROUP}; use backend='torch'"
    return None


def kivi_quantize(
    x: torch.Tensor, quantizer: KIVI, *, backend: KernelBackend | None = None
) -> QuantizedTensor:
    """``quantizer.quantize(x)`` with the group statistics, codes and packing in a kernel.

    >>> kq = KIVI(dim=8, bits=2, role="value", group_size=4, residual_length=2)
    >>> x = torch.randn(3, 10, 8)
    >>> torch.equal(kivi_quantize(x, kq, backend="torch").codes.data, kq.quantize(x).codes.data)
    True
    """
    check_input(x, quantizer.dim, min_ndim=2)
    num_tokens = x.shape[-2]
    n_quant = num_tokens - quantizer.dense_tokens(num_tokens)
    lead = x.shape[:-2]
    head = x.reshape(math.prod(lead), num_tokens, quantizer.dim)[:, :n_quant, :]  # [L, T_q, D]
    dense = x[..., n_quant:, :].to(window_dtype(x.dtype))  # [..., T - T_q, D]
    args = (quantizer.role, quantizer.group_size, quantizer.bits)
    unsupported = _kernel_unsupported(quantizer.group_size)
    if resolve_backend(backend, x, unsupported=unsupported) == "triton":
        from .triton import quantize_head as quantize_kernel

        packed, scales, zeros = quantize_kernel(head, *args)
    else:
        packed, scales, zeros = naive.quantize_head(head, *args)
    codes_shape = (*lead, n_quant, quantizer.dim)
    return QuantizedTensor(
        method=quantizer.name,
        shape=tuple(x.shape),
        dtype=x.dtype,
        codes=PackedCodes(data=packed, bits=quantizer.bits, shape=codes_shape),
        scales=scales.reshape(*lead, *scales.shape[1:]),  # keys [..., nG, D]; values [..., T_q, nG]
        zero_points=zeros.reshape(*lead, *zeros.shape[1:]),
        dense=dense.contiguous(),
    )


def kivi_dequantize(
    q: QuantizedTensor, quantizer: KIVI, *, backend: KernelBackend | None = None
) -> torch.Tensor:
    """``quantizer.dequantize(q)`` with unpacking and the group affine map in a kernel."""
    check_owner(q, quantizer.name, quantizer.dim)
    check_code_bits(q.codes, quantizer.bits, "codes")
    if q.codes is None or q.scales is None or q.zero_points is None or q.dense is None:
        raise ValueError("a KIVI tensor holds codes, scales, zero-points and a window")
    *lead, n_quant, dim = q.codes.shape
    if q.shape[-2] - n_quant != quantizer.dense_tokens(q.shape[-2]) or tuple(
        q.scales.shape
    ) != quantizer.side_shape(q.codes.shape):
        raise ValueError(
            f"tensor was quantized with another KIVI role, group_size, residual_length or "
            f"window (scales {tuple(q.scales.shape)}, {q.shape[-2] - n_quant} dense tokens)"
        )
    n_lead = math.prod(lead)
    shape = (n_lead, n_quant, dim)
    scales = q.scales.reshape(n_lead, *q.scales.shape[-2:])  # [L, ., .]
    zeros = q.zero_points.reshape(n_lead, *q.zero_points.shape[-2:])
    args = (shape, quantizer.role, quantizer.group_size, quantizer.bits, q.dtype)
    if resolve_backend(backend, q.codes.data) == "triton":
        from .triton import dequantize_head as dequantize_kernel

        head = dequantize_kernel(q.codes.data, scales, zeros, *args)
    else:
        head = naive.dequantize_head(q.codes.data, scales, zeros, *args)
    head = head.reshape(*lead, n_quant, dim)  # [..., T_q, D]
    return torch.cat([head, q.dense.to(q.dtype)], dim=-2)  # [..., T, D]

"""TurboQuant_mse with the randomized Hadamard rotation (arXiv 2504.19874, fast variant): fused
quantize (rotate + Lloyd-Max bucket + bit-pack) and dequantize (unpack + lookup + inverse rotate).

Motivation: TurboQuant is the per-vector quantizer seqkv composes with and is measured against;
on a GPU its torch form is a chain of small memory-bound passes. These functions take a
:class:`seqkv.quantizers.TurboQuantMSE` built with ``rotation="hadamard"`` and return or accept
exactly the :class:`seqkv.quantizers.QuantizedTensor` that quantizer uses, so the two
interoperate: ``quantizer.dequantize(turboquant_quantize(x, quantizer))`` works, and so does the
other way round.

Invariants:
1. The codebook and the signs come from the quantizer (enforced: read from
   ``quantizer.codebook`` and ``quantizer.rotation``, never recomputed).
2. Both backends return identical codes and norms (checked: ``tests/test_kernels_turboquant.py``).
3. Norms are stored in fp16 and overflow raises as in the quantizer (enforced:
   :func:`seqkv.quantizers.base.to_side`).
4. Only ``rotation="hadamard"`` is implemented (enforced: ``ValueError`` otherwise).
5. Against ``quantizer.quantize``, a code may differ where a rotated coordinate lies within
   float32 rounding of a threshold: the quantizer's norm comes from
   ``torch.linalg.vector_norm``, whose summation order no kernel can reproduce, and it divides
   by ``sqrt(d)`` where these multiply by ``1/sqrt(d)`` (checked: at most 5 of 256,000 codes,
   all within 1e-6 of a threshold). The fp16 norms agree unless the two float32 norms
   straddle an fp16 rounding boundary (checked: equal on 2,000 random vectors).
"""

from __future__ import annotations

import torch

from seqkv.quantizers import PackedCodes, QuantizedTensor, TurboQuantMSE
from seqkv.quantizers.base import check_code_bits, check_input, check_owner, to_side

from ..dispatch import KernelBackend, resolve_backend
from . import naive

__all__ = ["turboquant_dequantize", "turboquant_quantize"]

_KERNEL_MIN_DIM = 8
_KERNEL_MAX_DIM = 1024


def _signs(quantizer: TurboQuantMSE, device: torch.device) -> torch.Tensor:
    rotation = quantizer.rotation
    if rotation.kind != "hadamard" or rotation.signs is None:
        raise ValueError(
            f"the fused TurboQuant kernels implement the randomized Hadamard rotation; build the "
            f"quantizer with TurboQuantMSE(dim, bits, rotation='hadamard'), got {rotation.kind!r}"
        )
    return rotation.signs.to(device)


def _kernel_unsupported(dim: int) -> str | None:
    if not _KERNEL_MIN_DIM <= dim <= _KERNEL_MAX_DIM:
        return (
            f"head dimension {dim} is outside {_KERNEL_MIN_DIM}..{_KERNEL_MAX_DIM}; "
            "use backend='torch'"
        )
    return None


def turboquant_quantize(
    x: torch.Tensor, quantizer: TurboQuantMSE, *, backend: KernelBackend | None = None
) -> QuantizedTensor:
    """``quantizer.quantize(x)`` through the fused kernel (or its reference).

    >>> q = TurboQuantMSE(dim=16, bits=3, rotation="hadamard")
    >>> qx = turboquant_quantize(torch.randn(2, 5, 16), q, backend="torch")
    >>> qx.num_bits == 2 * 5 * (16 * 3 + 16)
    True
    """
    check_input(x, quantizer.dim)
    signs = _signs(quantizer, x.device)
    rows = x.reshape(-1, quantizer.dim)  # [N, D]
    thresholds = quantizer.codebook.thresholds_tensor(x.device)
    chosen = resolve_backend(backend, x, unsupported=_kernel_unsupported(quantizer.dim))
    if chosen == "triton":
        from .triton import encode as encode_kernel

        packed, norms = encode_kernel(rows, signs, thresholds, quantizer.bits)
    else:
        packed, norms = naive.encode(rows, signs, thresholds, quantizer.bits)
    return QuantizedTensor(
        method=quantizer.name,
        shape=tuple(x.shape),
        dtype=x.dtype,
        codes=PackedCodes(data=packed, bits=quantizer.bits, shape=tuple(x.shape)),
        scales=to_side(norms, "vector norm").reshape(x.shape[:-1]),  # [..., T]
    )


def turboquant_dequantize(
    q: QuantizedTensor, quantizer: TurboQuantMSE, *, backend: KernelBackend | None = None
) -> torch.Tensor:
    """``quantizer.dequantize(q)`` through the fused kernel (or its reference)."""
    check_owner(q, quantizer.name, quantizer.dim)
    check_code_bits(q.codes, quantizer.bits, "codes")
    if q.codes is None or q.scales is None:
        raise ValueError("a TurboQuant_mse tensor holds codes and norms; this one lacks them")
    packed = q.codes.data
    signs = _signs(quantizer, packed.device)
    levels = quantizer.codebook.levels_tensor(packed.device)
    norms = q.scales.reshape(-1)  # [N]
    chosen = resolve_backend(backend, packed, unsupported=_kernel_unsupported(quantizer.dim))
    if chosen == "triton":
        from .triton import decode as decode_kernel

        rows = decode_kernel(packed, norms, signs, levels, quantizer.bits, q.dtype)
    else:
        rows = naive.decode(packed, norms, signs, levels, quantizer.bits, q.dtype)
    return rows.reshape(q.shape)  # [..., T, D]

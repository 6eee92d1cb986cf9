"""Per-vector quantizers: the baselines seqkv is measured against and what its residual coder
composes with. One method per module, all behind the :class:`Quantizer` protocol and all
returning a :class:`QuantizedTensor` that counts its own bits (payload plus side information).

- :class:`TurboQuantMSE`, :class:`TurboQuantProd`: TurboQuant (arXiv 2504.19874).
- :class:`KIVI`: KIVI (arXiv 2402.02750), keys per channel, values per token, 16-bit window.
- :class:`Int8Absmax`, :class:`FP8E4M3`: 8-bit formats with a per-vector fp16 scale.

Each quantizer computes through a kernel op of :mod:`seqkv.kernels` (TurboQuant, KIVI, absmax):
the op's torch reference on a CPU, its Triton kernel on a GPU (``SEQKV_KERNELS`` overrides).

>>> q = make_quantizer("turboquant_mse", dim=64, bits=4)
>>> isinstance(q, Quantizer)
True
"""

from __future__ import annotations

from typing import Literal, overload

from seqkv.errors import QuantizerConfigError
from seqkv.quantizers.base import PackedCodes, QuantizedTensor, Quantizer, QuantizerName
from seqkv.quantizers.bitpack import pack_bits, packed_nbytes, unpack_bits
from seqkv.quantizers.kivi import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_RESIDUAL_LENGTH,
    KIVI,
    KiviRole,
    KiviWindow,
)
from seqkv.quantizers.lloyd_max import CoordinateLaw, ScalarCodebook, lloyd_max_codebook
from seqkv.quantizers.rotation import Rotation, RotationKind
from seqkv.quantizers.turboquant import TurboQuantMSE, TurboQuantProd
from seqkv.quantizers.uniform import FP8E4M3, Int8Absmax

__all__ = [
    "FP8E4M3",
    "KIVI",
    "CoordinateLaw",
    "Int8Absmax",
    "KiviRole",
    "KiviWindow",
    "PackedCodes",
    "QuantizedTensor",
    "Quantizer",
    "QuantizerName",
    "Rotation",
    "RotationKind",
    "ScalarCodebook",
    "TurboQuantMSE",
    "TurboQuantProd",
    "lloyd_max_codebook",
    "make_quantizer",
    "pack_bits",
    "packed_nbytes",
    "unpack_bits",
]


@overload
def make_quantizer(
    name: Literal["turboquant_mse"],
    dim: int,
    bits: int,
    *,
    rotation: RotationKind = ...,
    seed: int = ...,
    role: KiviRole = ...,
    group_size: int = ...,
    residual_length: int = ...,
    window: KiviWindow = ...,
) -> TurboQuantMSE: ...


@overload
def make_quantizer(
    name: Literal["turboquant_prod"],
    dim: int,
    bits: int,
    *,
    rotation: RotationKind = ...,
    seed: int = ...,
    role: KiviRole = ...,
    group_size: int = ...,
    residual_length: int = ...,
    window: KiviWindow = ...,
) -> TurboQuantProd: ...


@overload
def make_quantizer(
    name: Literal["kivi"],
    dim: int,
    bits: int,
    *,
    rotation: RotationKind = ...,
    seed: int = ...,
    role: KiviRole = ...,
    group_size: int = ...,
    residual_length: int = ...,
    window: KiviWindow = ...,
) -> KIVI: ...


@overload
def make_quantizer(
    name: QuantizerName,
    dim: int,
    bits: int,
    *,
    rotation: RotationKind = ...,
    seed: int = ...,
    role: KiviRole = ...,
    group_size: int = ...,
    residual_length: int = ...,
    window: KiviWindow = ...,
) -> Quantizer: ...


def make_quantizer(
    name: QuantizerName,
    dim: int,
    bits: int,
    *,
    rotation: RotationKind = "orthogonal",
    seed: int = 0,
    role: KiviRole = "key",
    group_size: int = DEFAULT_GROUP_SIZE,
    residual_length: int = DEFAULT_RESIDUAL_LENGTH,
    window: KiviWindow = "recent",
) -> Quantizer:
    """Build a quantizer by name. Options a method does not use are ignored: ``rotation`` and
    ``seed`` are TurboQuant's, ``role``, ``group_size``, ``residual_length`` and ``window``
    KIVI's. ``int8`` and ``fp8`` take ``bits=8`` only.
    """
    if name == "turboquant_mse":
        return TurboQuantMSE(dim, bits, rotation=rotation, seed=seed)
    if name == "turboquant_prod":
        return TurboQuantProd(dim, bits, rotation=rotation, seed=seed)
    if name == "kivi":
        return KIVI(
            dim,
            bits,
            role=role,
            group_size=group_size,
            residual_length=residual_length,
            window=window,
        )
    if name in ("int8", "fp8"):
        if bits != 8:
            raise QuantizerConfigError(
                f"{name!r} stores 8 bits per component; pass bits=8, got {bits}"
            )
        return Int8Absmax(dim) if name == "int8" else FP8E4M3(dim)
    raise QuantizerConfigError(
        f"unknown quantizer {name!r}; expected one of turboquant_mse, turboquant_prod, kivi, "
        "int8, fp8"
    )

"""The shared contract of seqkv's per-vector quantizers and their honest bit accounting.

Motivation: seqkv's residual coder composes with any per-vector quantizer, and the baselines it
is measured against (TurboQuant, KIVI, int8, fp8) are such quantizers too. A comparison between
them only means something when every one of them is charged for everything it stores: the packed
codes *and* the side information (norms, scales, zero-points, full-precision windows). This
module holds the one container all of them return, :class:`QuantizedTensor`, which counts its own
bits from what it actually holds, and the :class:`Quantizer` protocol.

Inputs have shape ``[..., T, D]`` (a KV cache is ``[B, H, T, D]``); vectors run along the last
dimension ``D``. Quantizers compute in float32 whatever the input dtype, and ``dequantize``
returns the input's dtype. The computation itself is the kernel layer's (:mod:`seqkv.kernels`):
every quantizer calls a kernel op for its quantize and dequantize, which runs the op's torch
reference on a CPU and its Triton kernel on a GPU; a quantizer owns its configuration, the
input checks and the stored format.

Invariants:
1. Every tensor a :class:`QuantizedTensor` holds is counted in :attr:`QuantizedTensor.num_bits`:
   packed code streams at their byte size, side tensors at ``numel * element_size * 8``
   (enforced by construction: the count iterates over the fields, it is not a formula).
2. ``num_valid_bits <= num_bits < num_valid_bits + 8 * (number of code streams)``: the only
   difference is the zero padding of each stream's last byte (enforced by construction).
3. Side tensors are stored in a 16-bit float type (fp16, or bf16 for a bf16 window), so a scale or
   norm costs 16 bits (checked: each quantizer's exact-count test).
4. A quantizer's ``num_bits_for(shape)`` equals the ``num_bits`` of what it returns for an input
   of that shape (checked: ``tests/test_quantizers_bits.py``).
5. ``QuantizedTensor`` is immutable (enforced: frozen dataclass; the tensors it holds are not
   copied, so callers must not write into them; assumed).
6. ``dequantize`` is called on the quantizer configuration that produced the tensor. The method
   name, ``dim`` and code widths are checked (``QuantizedDataMismatchError``); a different
   TurboQuant ``seed`` or ``rotation`` cannot be detected and decodes to garbage (assumed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal, Protocol, runtime_checkable

import torch

from seqkv.errors import InvalidTensorDtypeError, InvalidTensorError, QuantizedDataMismatchError
from seqkv.kernels.common.bitpack import check_bits, pack_bits, packed_nbytes, unpack_bits

QuantizerName = Literal["turboquant_mse", "turboquant_prod", "kivi", "int8", "fp8"]
"""The quantizers :func:`seqkv.quantizers.make_quantizer` can build."""

SIDE_DTYPE = torch.float16
"""Storage type of every norm, scale and zero-point (16 bits each)."""


@dataclass(frozen=True, eq=False)
class PackedCodes:
    """``count = prod(shape)`` integer codes of ``bits`` bits, packed by :func:`pack_bits`."""

    data: torch.Tensor
    """1-D uint8 tensor of exactly ``packed_nbytes(count, bits)`` bytes."""
    bits: int
    shape: tuple[int, ...]
    """Shape of the code array before packing (``unpack`` restores it)."""

    def __post_init__(self) -> None:
        check_bits(self.bits)
        if self.data.dtype != torch.uint8 or self.data.dim() != 1:
            raise InvalidTensorDtypeError(f"data must be a 1-D uint8 tensor, got {self.data.dtype}")
        if self.data.numel() != packed_nbytes(self.count, self.bits):
            raise InvalidTensorError(
                f"{self.count} codes of {self.bits} bits need "
                f"{packed_nbytes(self.count, self.bits)} bytes, got {self.data.numel()}"
            )

    @classmethod
    def pack(cls, codes: torch.Tensor, bits: int) -> PackedCodes:
        """Pack an integer code array of any shape."""
        return cls(data=pack_bits(codes, bits), bits=bits, shape=tuple(codes.shape))

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def num_bits(self) -> int:
        """Stored bits, including the zero padding of the last byte."""
        return 8 * self.data.numel()

    @property
    def num_valid_bits(self) -> int:
        """Information bits: ``count * bits`` (no padding)."""
        return self.count * self.bits

    def unpack(self) -> torch.Tensor:
        """The codes as a uint8 tensor of :attr:`shape`."""
        return unpack_bits(self.data, self.bits, self.count).reshape(self.shape)


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """What a quantizer stores for one input tensor: packed codes plus side information.

    Fields a method does not use are ``None``; which are used is listed per quantizer.
    """

    method: QuantizerName
    shape: tuple[int, ...]
    """Shape of the quantized input, ``[..., T, D]``."""
    dtype: torch.dtype
    """Dtype of the input; ``dequantize`` returns this dtype."""
    codes: PackedCodes | None
    """Main payload. ``None`` only for TurboQuantProd at 1 bit (no MSE stage)."""
    scales: torch.Tensor | None = None
    """Per-vector norms (TurboQuant) or absmax scales (int8, fp8), per-group scales (KIVI)."""
    zero_points: torch.Tensor | None = None
    """Per-group minimum (KIVI)."""
    sketch: PackedCodes | None = None
    """1-bit QJL signs of the residual (TurboQuantProd)."""
    residual_norms: torch.Tensor | None = None
    """Norm of the MSE stage's residual, per vector (TurboQuantProd)."""
    dense: torch.Tensor | None = None
    """Tokens kept in 16-bit floating point (KIVI's recent window), ``[..., R, D]``."""

    def _streams(self) -> list[PackedCodes]:
        return [s for s in (self.codes, self.sketch) if s is not None]

    def _side(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out.append(value)
        return out

    @property
    def payload_bits(self) -> int:
        """Stored bits of the packed code streams (byte padding included)."""
        return sum(s.num_bits for s in self._streams())

    @property
    def side_bits(self) -> int:
        """Stored bits of every side tensor: norms, scales, zero-points, dense window."""
        return sum(t.numel() * t.element_size() * 8 for t in self._side())

    @property
    def num_bits(self) -> int:
        """Everything stored, in bits: packed streams at their byte size plus side tensors."""
        return self.payload_bits + self.side_bits

    @property
    def num_valid_bits(self) -> int:
        """Like :attr:`num_bits` without the zero padding of each stream's last byte."""
        return sum(s.num_valid_bits for s in self._streams()) + self.side_bits

    @property
    def num_components(self) -> int:
        return math.prod(self.shape)

    @property
    def bits_per_component(self) -> float:
        """``num_bits / num_components``: the figure to compare across quantizers."""
        n = self.num_components
        return self.num_bits / n if n else 0.0


@runtime_checkable
class Quantizer(Protocol):
    """A per-vector quantizer of tensors shaped ``[..., T, D]`` with ``D == dim``."""

    @property
    def name(self) -> QuantizerName: ...

    @property
    def dim(self) -> int: ...

    @property
    def bits(self) -> int:
        """Nominal bits per component of the main payload (side information excluded)."""
        ...

    def quantize(self, x: torch.Tensor) -> QuantizedTensor: ...

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor: ...

    def num_bits_for(self, shape: tuple[int, ...]) -> int:
        """``quantize(x).num_bits`` for any ``x`` of this shape, without quantizing."""
        ...


def check_input(x: torch.Tensor, dim: int, min_ndim: int = 1) -> None:
    """Preconditions shared by every quantizer; raise a specific error saying what to fix."""
    if not x.dtype.is_floating_point:
        raise InvalidTensorDtypeError(f"expected a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < min_ndim:
        raise InvalidTensorError(
            f"expected a tensor with at least {min_ndim} dims ([..., T, D]), got shape "
            f"{tuple(x.shape)}"
        )
    if x.shape[-1] != dim:
        raise InvalidTensorError(
            f"last dimension must equal the quantizer's dim={dim}, got shape {tuple(x.shape)}; "
            "build the quantizer for this head dimension"
        )
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise InvalidTensorError(
            "input contains NaN or inf; quantizers need finite values: replace or drop the "
            "non-finite entries first"
        )


def check_owner(q: QuantizedTensor, method: QuantizerName, dim: int) -> None:
    """Raise ``QuantizedDataMismatchError`` when ``q`` was not produced by a quantizer of this
    kind and dim."""
    if q.method != method:
        raise QuantizedDataMismatchError(
            f"cannot dequantize a {q.method!r} tensor with a {method!r} quantizer; dequantize "
            "with the quantizer that produced it"
        )
    if not q.shape or q.shape[-1] != dim:
        raise QuantizedDataMismatchError(
            f"tensor of shape {q.shape} was not quantized with dim={dim}; dequantize with a "
            "quantizer built for its head dimension"
        )


def check_code_bits(codes: PackedCodes | None, bits: int | None, what: str) -> None:
    """Raise ``QuantizedDataMismatchError`` unless ``codes`` holds ``bits``-bit codes
    (``None``: no stream)."""
    got = None if codes is None else codes.bits
    if got != bits:
        raise QuantizedDataMismatchError(
            f"{what} holds {got}-bit codes but this quantizer expects {bits}; "
            "dequantize with the quantizer configuration that produced it"
        )

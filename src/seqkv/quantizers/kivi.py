"""KIVI (Liu et al., arXiv 2402.02750): asymmetric 2-bit KV quantization, keys per channel.

Motivation: KIVI observed that key caches have a few outlier *channels* (fixed across tokens)
while value caches have no such structure, so keys are quantized per channel (each group is
``group_size`` consecutive tokens of one channel) and values per token (each group is
``group_size`` consecutive channels of one token). The most recent ``residual_length`` tokens are
kept in 16-bit floating point. It is a baseline seqkv is measured against.

Quantization of one group with minimum ``m`` and maximum ``M`` at ``b`` bits (asymmetric,
zero-point = minimum): ``scale = (M - m) / (2^b - 1)``, ``code = round((x - m) / scale)``,
``xhat = code * scale + m``. Scale and zero-point are stored in fp16 per group.

Window (:data:`KiviWindow`):
- ``"recent"`` (default): the last ``min(T, residual_length)`` tokens stay in 16-bit for keys and
  for values, as the brief and ANCHORS.md describe KIVI ("the most recent 128 tokens").
- ``"streaming"``: the exact state KIVI's Algorithm 1 leaves after prefill/decoding ``T`` tokens:
  values keep the last ``min(T, R)`` tokens; keys are quantized in whole blocks of ``R`` tokens,
  so only the last ``T mod R`` key tokens stay in 16-bit. Needs ``R % group_size == 0``.

The group statistics, codes and packing, and their inverse, are the kernel op
:mod:`seqkv.kernels.kivi` (its torch reference on a CPU, its Triton kernels on a GPU): keys call
it grouped along tokens, values along channels. This module owns the window, shapes and checks.
NOTE: moving the computation into the op changed no stored bit: codes, scales, zero-points,
window and decoded values are identical to the former in-module torch code (keys, 4 x 5,000
random tokens per head dim 64, 128 and 96 at 1..4 bits), and every figure of
``benchmarks/bench_quantizers.py --figures`` (keys and values, 1..4 bits) is unchanged.

Stores: ``codes`` (``b`` bits per quantized component, shape ``[..., T_q, D]``), ``scales`` and
``zero_points`` (fp16; keys ``[..., ceil(T_q / G), D]``, values ``[..., T_q, ceil(D / G)]``),
``dense`` (the 16-bit window ``[..., T - T_q, D]``: the input's dtype when it is fp16 or bf16,
else fp16).

Invariants:
1. Every quantized element is within half its group's stored step ``scale / 2`` of the input
   (enforced: the fp16 zero-point is rounded *down* and the fp16 scale *up*, so no code is ever
   clamped; checked: ``tests/test_quantizers_kivi.py``, up to float32 rounding).
2. The window is returned exactly when the input is fp16 or bf16 (enforced; checked).
3. A group along keys' token axis or values' channel axis that is cut short by ``T_q`` or ``D``
   forms a smaller last group with its own scale (enforced; checked).
4. Constant groups (``M == m``) have scale 0 and decode exactly to their fp16 zero-point
   (enforced).

Deviations from the paper:
- KIVI's kernels compute the scale and zero-point in fp16 with round-to-nearest; here they are
  rounded outward (zero-point down, scale up), which costs nothing in bits and makes invariant 1
  hold exactly.
- The default window is ``"recent"`` (last ``R`` tokens for keys too); KIVI's own streaming
  schedule is available as ``window="streaming"``.
- This quantizes a whole cache snapshot at once; KIVI's incremental decode-time updates produce
  the same stored state as ``"streaming"`` but are not implemented as a cache here.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from seqkv.errors import InvalidTensorError, QuantizedDataMismatchError, QuantizerConfigError
from seqkv.kernels import GroupAxis, kivi_dequantize, kivi_quantize
from seqkv.kernels.common.bitpack import check_bits, packed_nbytes
from seqkv.quantizers.base import (
    PackedCodes,
    QuantizedTensor,
    QuantizerName,
    check_code_bits,
    check_input,
    check_owner,
)

KiviRole = Literal["key", "value"]
"""``"key"``: per-channel groups along tokens; ``"value"``: per-token groups along channels."""

KiviWindow = Literal["recent", "streaming"]

DEFAULT_GROUP_SIZE = 32
"""KIVI's G: 32 tokens (keys) or 32 channels (values) per group."""
DEFAULT_RESIDUAL_LENGTH = 128
"""KIVI's R: recent tokens kept in 16-bit floating point."""

_WINDOW_DTYPES = (torch.float16, torch.bfloat16)


def window_dtype(dtype: torch.dtype) -> torch.dtype:
    """The window keeps fp16 and bf16 inputs as they are and stores anything else as fp16."""
    return dtype if dtype in _WINDOW_DTYPES else torch.float16


class KIVI:
    """KIVI at ``bits`` bits (default 2) for one role (keys or values).

    >>> kq = KIVI(dim=64, bits=2, role="key")
    >>> x = torch.randn(1, 2, 300, 64, dtype=torch.float16)
    >>> qx = kq.quantize(x)
    >>> bool((kq.dequantize(qx)[..., -128:, :] == x[..., -128:, :]).all())
    True
    """

    def __init__(
        self,
        dim: int,
        bits: int = 2,
        role: KiviRole = "key",
        group_size: int = DEFAULT_GROUP_SIZE,
        residual_length: int = DEFAULT_RESIDUAL_LENGTH,
        window: KiviWindow = "recent",
    ) -> None:
        check_bits(bits)
        if dim < 1:
            raise QuantizerConfigError(f"dim must be positive, got {dim}")
        if role not in ("key", "value"):
            raise QuantizerConfigError(f"role must be 'key' or 'value', got {role!r}")
        if window not in ("recent", "streaming"):
            raise QuantizerConfigError(f"window must be 'recent' or 'streaming', got {window!r}")
        if group_size < 1:
            raise QuantizerConfigError(f"group_size must be positive, got {group_size}")
        if residual_length < 0:
            raise QuantizerConfigError(
                f"residual_length must be non-negative, got {residual_length}"
            )
        if window == "streaming" and (residual_length < 1 or residual_length % group_size):
            raise QuantizerConfigError(
                f"window='streaming' quantizes keys in blocks of residual_length, which must be "
                f"a positive multiple of group_size={group_size}; got {residual_length}"
            )
        self._dim = dim
        self._bits = bits
        self._role: KiviRole = role
        self._group_size = group_size
        self._residual_length = residual_length
        self._window: KiviWindow = window

    @property
    def role(self) -> KiviRole:
        return self._role

    @property
    def group_size(self) -> int:
        return self._group_size

    @property
    def residual_length(self) -> int:
        return self._residual_length

    @property
    def window(self) -> KiviWindow:
        return self._window

    @property
    def name(self) -> QuantizerName:
        return "kivi"

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def bits(self) -> int:
        return self._bits

    def dense_tokens(self, num_tokens: int) -> int:
        """How many of the last tokens of a length-``num_tokens`` cache stay in 16-bit."""
        if self.window == "streaming" and self.role == "key":
            return num_tokens % self.residual_length
        return min(num_tokens, self.residual_length)

    @property
    def axis(self) -> GroupAxis:
        """The kernel op's grouping: keys along tokens, values along channels."""
        return "tokens" if self.role == "key" else "channels"

    def side_shape(self, codes_shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of scales and zero-points for codes ``[..., T_q, D]``."""
        *lead, n_quant, dim = codes_shape
        if self.role == "key":
            return (*lead, -(-n_quant // self.group_size), dim)
        return (*lead, n_quant, -(-dim // self.group_size))

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        check_input(x, self._dim, min_ndim=2)
        num_tokens = x.shape[-2]
        n_quant = num_tokens - self.dense_tokens(num_tokens)
        lead = x.shape[:-2]
        head = x.reshape(math.prod(lead), num_tokens, self._dim)[:, :n_quant, :]  # [L, T_q, D]
        dense = x[..., n_quant:, :].to(window_dtype(x.dtype))  # [..., T - T_q, D]
        packed, scales, zeros = kivi_quantize(head, self.axis, self.group_size, self._bits)
        return QuantizedTensor(
            method=self.name,
            shape=tuple(x.shape),
            dtype=x.dtype,
            codes=PackedCodes(data=packed, bits=self._bits, shape=(*lead, n_quant, self._dim)),
            # keys [..., n_groups, D]; values [..., T_q, n_groups]
            scales=scales.reshape(*lead, *scales.shape[1:]),
            zero_points=zeros.reshape(*lead, *zeros.shape[1:]),
            dense=dense.contiguous(),
        )

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor:
        check_owner(q, self.name, self._dim)
        check_code_bits(q.codes, self._bits, "codes")
        assert q.codes is not None and q.scales is not None and q.zero_points is not None
        assert q.dense is not None
        *lead, n_quant, dim = q.codes.shape
        if q.shape[-2] - n_quant != self.dense_tokens(q.shape[-2]) or tuple(q.scales.shape) != (
            self.side_shape(q.codes.shape)
        ):
            raise QuantizedDataMismatchError(
                f"tensor was quantized with another KIVI role, group_size, residual_length or "
                f"window (scales {tuple(q.scales.shape)}, {q.shape[-2] - n_quant} dense tokens)"
            )
        n_lead = math.prod(lead)
        scales = q.scales.reshape(n_lead, *q.scales.shape[-2:])  # [L, ., .]
        zeros = q.zero_points.reshape(n_lead, *q.zero_points.shape[-2:])
        head = kivi_dequantize(q.codes.data, scales, zeros, (n_lead, n_quant, dim), self.axis,
                               self.group_size, self._bits, q.dtype)
        head = head.reshape(*lead, n_quant, dim)  # [..., T_q, D]
        return torch.cat([head, q.dense.to(q.dtype)], dim=-2)  # [..., T, D]

    def num_bits_for(self, shape: tuple[int, ...]) -> int:
        if len(shape) < 2:
            raise InvalidTensorError(f"KIVI needs [..., T, D] shapes, got {shape}")
        lead = math.prod(shape[:-2])
        num_tokens, dim = shape[-2], shape[-1]
        n_dense = self.dense_tokens(num_tokens)
        n_quant = num_tokens - n_dense
        if self.role == "key":
            n_groups = dim * math.ceil(n_quant / self.group_size)
        else:
            n_groups = n_quant * math.ceil(dim / self.group_size)
        payload = 8 * packed_nbytes(lead * n_quant * dim, self._bits)
        return payload + lead * (32 * n_groups + 16 * n_dense * dim)

"""The warm tier: a session's KV as layer-2 delta codes, restored without a model forward.

Motivation: seqkv's exact codec stores a session in a few hundred bytes, but restoring its KV
costs a model forward over the tokens: it saves storage, not time to first token. The warm tier
is the other point of the curve (arXiv 2604.15356's layer 2): each KV vector is stored as a
quantized residual from a prediction the decoder rebuilds from what it already decoded
(``seqkv.delta`` predictors ``NoPrediction`` and ``PreviousToken``, composed with any quantizer
of ``seqkv.quantizers``), so a load is a dequantization, no forward. That coding is lossy. The
exact coding (``compress_exact``, ``seqkv.warm.exact``) keeps the KV's own bits in its own
dtype, at fewer bytes than raw and many more than the lossy one, for users whose outputs must not
change; ``decompress_warm`` reads both. The connector (``seqkv.integrations.vllm``) stores one or
the other (its ``warm_mode``).

>>> from seqkv.models import tiny_random_llama
>>> model = tiny_random_llama()
>>> tokens = [5, 17, 17, 3, 9, 44]
>>> kv = model.prefill(tokens)
>>> result = compress_warm(model, kv, quantizer="turboquant_mse", bits=4, tokens=tokens)
>>> result.stats.total_bytes == len(result.data)
True
>>> restored = decompress_warm(model, result.data, tokens=tokens)
>>> restored.kv.shape, torch.equal(restored.kv, result.decoded)
(torch.Size([2, 2, 2, 6, 16]), True)
>>> exact = compress_exact(model, kv, tokens=tokens)
>>> back = decompress_warm(model, exact.data, tokens=tokens).kv
>>> torch.equal(back.view(torch.int32), model.kv_tensor(kv).view(torch.int32))
True
>>> exact.stats.total_bytes < 4 * exact.stats.num_components
True

Invariants:
1. ``decompress_warm(model, compress_warm(model, kv, ...).data).kv`` equals ``.decoded`` bit for
   bit on one machine (checked: ``tests/test_warm.py``); ``compress_exact``'s ``.decoded`` is
   its input, bit for bit, on any machine (checked: ``tests/test_warm_exact.py``).
2. ``WarmStats.total_bytes == len(data)``: bits per element count every byte, header, framing
   and checksum included (enforced by construction).
3. An entry of another model, of other tokens (when ``tokens`` are passed), or damaged anywhere
   is refused with a ``SeqKVError`` before any KV is returned (enforced: ``seqkv.warm.entry``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import DynamicCache

from seqkv.digests import Digest, tokens_digest
from seqkv.errors import InvalidKVError
from seqkv.formats.framing import framing_overhead
from seqkv.kvcache import tensor_from_cache
from seqkv.models.adapter import CausalLM
from seqkv.quantizers import QuantizerName
from seqkv.types import KVGeometry
from seqkv.warm.codec import WarmCodec, steps_for
from seqkv.warm.config import (
    DEFAULT_PREDICTOR,
    EXACT_DTYPES,
    EntryConfig,
    ExactConfig,
    WarmConfig,
    WarmMode,
    WarmModel,
    WarmPredictor,
)
from seqkv.warm.entry import EntryHeader, header_bytes, read_entry, write_entry
from seqkv.warm.exact import ExactCodec

__all__ = [
    "EntryConfig",
    "ExactCodec",
    "ExactConfig",
    "SegmentCodec",
    "WarmCodec",
    "WarmConfig",
    "WarmDecoded",
    "WarmMode",
    "WarmModel",
    "WarmResult",
    "WarmStats",
    "compress_exact",
    "compress_warm",
    "decompress_warm",
    "segment_codec",
    "steps_for",
]


class SegmentCodec(Protocol):
    """What a warm tier needs of a codec: equal-length segments to payloads and back."""

    @property
    def num_tokens(self) -> int: ...

    def encode(self, kv: torch.Tensor) -> tuple[list[bytes], torch.Tensor]:
        """Payloads of ``[segments, L, 2, H, T, D]``, and the KV their decode gives."""
        ...

    def decode(self, payloads: Sequence[bytes]) -> torch.Tensor:
        """``[segments, L, 2, H, T, D]`` of checked payloads; a ``SeqKVError`` otherwise."""
        ...


def segment_codec(config: EntryConfig, geometry: KVGeometry, num_tokens: int
                  ) -> WarmCodec | ExactCodec:
    """The codec of ``config``'s entries: ``ExactCodec`` or ``WarmCodec`` (every entry this
    package or the connector writes or reads is coded by the one this returns)."""
    if isinstance(config, ExactConfig):
        return ExactCodec(config, geometry, num_tokens)
    return WarmCodec(config, geometry, num_tokens)


@dataclass(frozen=True)
class WarmStats:
    """Every byte of one warm entry, by part."""

    num_tokens: int
    num_components: int
    """KV components coded: ``tokens * layers * 2 * kv_heads * head_dim``."""
    code_bytes: int
    """Packed quantizer codes (exact: the deflated top plane and the low planes)."""
    side_bytes: int
    """Norms, scales, zero-points, sketches (fp16 and packed signs); exact: the values' digest
    and the top plane's length."""
    header_bytes: int
    framing_bytes: int
    """Magic, version, section lengths, CRC-32."""

    @property
    def total_bytes(self) -> int:
        return self.code_bytes + self.side_bytes + self.header_bytes + self.framing_bytes

    @property
    def bits_per_element(self) -> float:
        return 8 * self.total_bytes / self.num_components

    @property
    def bytes_per_token(self) -> float:
        return self.total_bytes / self.num_tokens


@dataclass(frozen=True)
class WarmResult:
    data: bytes
    stats: WarmStats
    decoded: torch.Tensor
    """What ``decompress_warm`` rebuilds, ``[layers, 2, kv_heads, T, head_dim]``: float32 for a
    lossy entry, the KV itself for an exact one."""


@dataclass(frozen=True)
class WarmDecoded:
    kv: torch.Tensor
    """``[layers, 2, kv_heads, T, head_dim]``: float32 for a lossy entry, the stored dtype for
    an exact one."""
    config: EntryConfig
    stats: WarmStats


def _warm_model(model: CausalLM | WarmModel) -> WarmModel:
    return model if isinstance(model, WarmModel) else WarmModel.of(model)


def _stats(codec: WarmCodec | ExactCodec, header: bytes, payload: bytes, data: bytes
           ) -> WarmStats:
    g = codec.geometry
    if isinstance(codec, ExactCodec):
        side = codec.side_bytes(payload)
        code = len(payload) - side
    else:
        code, side = codec.code_bytes, codec.payload_bytes - codec.code_bytes
    return WarmStats(codec.num_tokens, codec.num_tokens * g.components_per_token, code, side,
                     len(header), len(data) - len(payload) - len(header))


def _checked(warm: WarmModel, kv: DynamicCache | torch.Tensor, tokens: Sequence[int] | None,
             tag: Digest | None) -> tuple[torch.Tensor, Digest | None]:
    """``kv`` as ``[layers, 2, kv_heads, T, head_dim]`` of ``warm``'s geometry, and the tag."""
    tensor = tensor_from_cache(kv) if isinstance(kv, DynamicCache) else kv
    g = warm.geometry
    if tensor.dim() != 5 or (tensor.shape[0], tensor.shape[1], tensor.shape[2],
                             tensor.shape[4]) != (g.layers, 2, g.kv_heads, g.head_dim):
        raise InvalidKVError(
            f"the KV has shape {tuple(tensor.shape)}; this model's is [layers, 2, kv_heads, "
            f"tokens, head_dim] = [{g.layers}, 2, {g.kv_heads}, T, {g.head_dim}]"
        )
    if tokens is not None:
        if len(tokens) != tensor.shape[3]:
            raise InvalidKVError(f"got {len(tokens)} tokens for KV of {tensor.shape[3]} positions")
        tag = tokens_digest(tokens)
    return tensor, tag


def _entry(warm: WarmModel, tag: Digest | None, codec: WarmCodec | ExactCodec,
           tensor: torch.Tensor) -> WarmResult:
    payloads, decoded = codec.encode(tensor.unsqueeze(0))  # [1, L, 2, H, T, D]
    header = EntryHeader(warm.digest, tag, codec.config, warm.geometry, codec.num_tokens)
    data = write_entry(header, payloads[0])
    stats = _stats(codec, header_bytes(header), payloads[0], data)
    assert stats.framing_bytes == framing_overhead([header_bytes(header), payloads[0]])
    return WarmResult(data, stats, decoded[0])


def compress_warm(
    model: CausalLM | WarmModel,
    kv: DynamicCache | torch.Tensor,
    *,
    predictor: WarmPredictor = DEFAULT_PREDICTOR,
    quantizer: QuantizerName = "turboquant_mse",
    bits: int = 3,
    seed: int = 0,
    tokens: Sequence[int] | None = None,
    tag: Digest | None = None,
) -> WarmResult:
    """Code one session's KV (``[layers, 2, kv_heads, T, head_dim]`` or a ``DynamicCache``)
    as a warm entry. ``tokens`` (or a ``tag`` of your own) are not stored, only their digest,
    so that ``decompress_warm`` can refuse an entry that stands for other tokens."""
    warm = _warm_model(model)
    config = WarmConfig(predictor, quantizer, bits, seed)
    tensor, tag = _checked(warm, kv, tokens, tag)
    return _entry(warm, tag, segment_codec(config, warm.geometry, int(tensor.shape[3])), tensor)


def compress_exact(
    model: CausalLM | WarmModel,
    kv: DynamicCache | torch.Tensor,
    *,
    tokens: Sequence[int] | None = None,
    tag: Digest | None = None,
) -> WarmResult:
    """Code one session's KV bit for bit in its own dtype (float32, bfloat16 or float16) as a
    warm entry (``seqkv.warm.exact``); ``tokens`` and ``tag`` as for ``compress_warm``."""
    warm = _warm_model(model)
    tensor, tag = _checked(warm, kv, tokens, tag)
    if str(tensor.dtype).removeprefix("torch.") not in EXACT_DTYPES:
        raise InvalidKVError(f"the exact coding takes KV of {', '.join(EXACT_DTYPES)}, not "
                             f"{tensor.dtype}")
    config = ExactConfig.of(tensor.dtype)
    return _entry(warm, tag, segment_codec(config, warm.geometry, int(tensor.shape[3])), tensor)


def decompress_warm(
    model: CausalLM | WarmModel,
    data: bytes,
    *,
    tokens: Sequence[int] | None = None,
    tag: Digest | None = None,
) -> WarmDecoded:
    """The KV of a warm entry, lossy or exact, after every check of ``seqkv.warm.entry`` and of
    its codec (invariant 3)."""
    warm = _warm_model(model)
    expected = tokens_digest(tokens) if tokens is not None else tag
    header, payload = read_entry(data, warm, expected)
    codec = segment_codec(header.config, header.geometry, header.num_tokens)
    kv = codec.decode([payload])[0]  # [L, 2, H, T, D]
    return WarmDecoded(kv, header.config, _stats(codec, header_bytes(header), payload, data))

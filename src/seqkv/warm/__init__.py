"""The warm tier: a session's KV as layer-2 delta codes, restored without a model forward.

Motivation: seqkv's exact codec stores a session in a few hundred bytes, but restoring its KV
costs a model forward over the tokens: it saves storage, not time to first token. The warm tier
is the other point of the curve (arXiv 2604.15356's layer 2): each KV vector is stored as a
quantized residual from a prediction the decoder rebuilds from what it already decoded
(``seqkv.delta`` predictors ``NoPrediction`` and ``PreviousToken``, composed with any quantizer
of ``seqkv.quantizers``), so a load is a dequantization, no forward. It is lossy: the connector
(``seqkv.integrations.vllm``) loads it only for requests that opt in.

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

Invariants:
1. ``decompress_warm(model, compress_warm(model, kv, ...).data).kv`` equals ``.decoded`` bit for
   bit on one machine (checked: ``tests/test_warm.py``).
2. ``WarmStats.total_bytes == len(data)``: bits per element count every byte, header, framing
   and checksum included (enforced by construction).
3. An entry of another model, of other tokens (when ``tokens`` are passed), or damaged anywhere
   is refused with a ``SeqKVError`` before any KV is returned (enforced: ``seqkv.warm.entry``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from seqkv.digests import Digest, tokens_digest
from seqkv.errors import InvalidKVError
from seqkv.formats.framing import framing_overhead
from seqkv.kvcache import tensor_from_cache
from seqkv.models.adapter import CausalLM
from seqkv.quantizers import QuantizerName
from seqkv.warm.codec import WarmCodec, steps_for
from seqkv.warm.config import DEFAULT_PREDICTOR, WarmConfig, WarmModel, WarmPredictor
from seqkv.warm.entry import EntryHeader, header_bytes, read_entry, write_entry

__all__ = [
    "WarmCodec",
    "WarmConfig",
    "WarmDecoded",
    "WarmModel",
    "WarmResult",
    "WarmStats",
    "compress_warm",
    "decompress_warm",
    "steps_for",
]


@dataclass(frozen=True)
class WarmStats:
    """Every byte of one warm entry, by part."""

    num_tokens: int
    num_components: int
    """KV components coded: ``tokens * layers * 2 * kv_heads * head_dim``."""
    code_bytes: int
    """Packed quantizer codes."""
    side_bytes: int
    """Norms, scales, zero-points, sketches (fp16 and packed signs)."""
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
    """What ``decompress_warm`` rebuilds, ``[layers, 2, kv_heads, T, head_dim]`` float32."""


@dataclass(frozen=True)
class WarmDecoded:
    kv: torch.Tensor
    """``[layers, 2, kv_heads, T, head_dim]`` float32."""
    config: WarmConfig
    stats: WarmStats


def _warm_model(model: CausalLM | WarmModel) -> WarmModel:
    return model if isinstance(model, WarmModel) else WarmModel.of(model)


def _stats(codec: WarmCodec, header: bytes, data: bytes) -> WarmStats:
    g = codec.geometry
    return WarmStats(codec.num_tokens, codec.num_tokens * g.components_per_token,
                     codec.code_bytes, codec.payload_bytes - codec.code_bytes, len(header),
                     len(data) - codec.payload_bytes - len(header))


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
    codec = WarmCodec(config, g, int(tensor.shape[3]))
    payloads, decoded = codec.encode(tensor.unsqueeze(0))  # [1, L, 2, H, T, D]
    header = EntryHeader(warm.digest, tag, config, g, codec.num_tokens)
    data = write_entry(header, payloads[0])
    stats = _stats(codec, header_bytes(header), data)
    assert stats.framing_bytes == framing_overhead([header_bytes(header), payloads[0]])
    return WarmResult(data, stats, decoded[0])


def decompress_warm(
    model: CausalLM | WarmModel,
    data: bytes,
    *,
    tokens: Sequence[int] | None = None,
    tag: Digest | None = None,
) -> WarmDecoded:
    """The KV of a warm entry, after every check of ``seqkv.warm.entry`` (invariant 3)."""
    warm = _warm_model(model)
    expected = tokens_digest(tokens) if tokens is not None else tag
    header, payload = read_entry(data, warm, expected)
    codec = WarmCodec(header.config, header.geometry, header.num_tokens)
    kv = codec.decode([payload])[0]  # [L, 2, H, T, D]
    return WarmDecoded(kv, header.config, _stats(codec, header_bytes(header), data))

"""The warm tier's codec (``seqkv.warm``): round trips, byte counts, and every refusal."""

from __future__ import annotations

import struct
import zlib

import pytest
import torch

from seqkv.delta import PreviousToken, encode_delta
from seqkv.delta.delta_codec import DeltaConfig
from seqkv.delta.predictors import NoPrediction, TopKExpectation
from seqkv.digests import Digest
from seqkv.errors import (
    CorruptFileError,
    DeltaConfigError,
    InvalidKVError,
    ModelMismatchError,
    NotASeqKVFileError,
    TruncatedFileError,
    WarmTagMismatchError,
)
from seqkv.formats.framing import frame, unframe
from seqkv.formats.warm_entry import ERRORS as _ERRORS
from seqkv.formats.warm_entry import MAGIC, VERSION
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.types import KVGeometry
from seqkv.warm import WarmCodec, WarmConfig, WarmModel, compress_warm, decompress_warm

TOKENS = [5, 17, 17, 3, 9, 44, 2, 8, 100, 7, 7, 31, 12]

CONFIGS = [
    WarmConfig(NoPrediction(), "turboquant_mse", 2),
    WarmConfig(PreviousToken(4), "turboquant_mse", 3),
    WarmConfig(PreviousToken(4, "anchor"), "turboquant_mse", 4),
    WarmConfig(PreviousToken(3), "turboquant_prod", 3),
    WarmConfig(NoPrediction(), "kivi", 2),
    WarmConfig(PreviousToken(5), "int8", 8),
    WarmConfig(NoPrediction(), "fp8", 8),
]


@pytest.fixture(scope="module")
def kv(tiny_model: CausalLM) -> torch.Tensor:
    return tiny_model.kv_tensor(tiny_model.prefill(TOKENS))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label)
def test_round_trip_and_byte_count(tiny_model: CausalLM, kv: torch.Tensor,
                                   config: WarmConfig) -> None:
    result = compress_warm(tiny_model, kv, predictor=config.predictor, quantizer=config.quantizer,
                           bits=config.bits, tokens=TOKENS)
    restored = decompress_warm(tiny_model, result.data, tokens=TOKENS)
    assert torch.equal(restored.kv, result.decoded)
    assert restored.config == config
    stats = result.stats
    assert stats.total_bytes == len(result.data) == restored.stats.total_bytes
    g = tiny_model.geometry
    assert stats.num_components == len(TOKENS) * g.components_per_token
    assert stats.bits_per_element == 8 * len(result.data) / stats.num_components
    # The quantizer's own count of what it stores, summed over the steps, is the payload.
    codec = WarmCodec(config, g, len(TOKENS))
    counted = sum(codec.quantizer.num_bits_for(
        (1, g.layers, 2, g.kv_heads, int(step.positions.numel()), g.head_dim))
        for step in codec.steps)
    assert 8 * (stats.code_bytes + stats.side_bytes) == counted
    error = (restored.kv - kv).square().mean() / kv.square().mean()
    assert float(error) < 0.5


def test_matches_the_sequential_delta_codec(tiny_model: CausalLM, kv: torch.Tensor) -> None:
    """The batched closed loop codes what ``encode_delta`` codes position by position (int8:
    the per-vector quantizer is exact up to float rounding of the same operations)."""
    config = WarmConfig(PreviousToken(4), "int8", 8)
    warm = compress_warm(tiny_model, kv, predictor=config.predictor, quantizer="int8", bits=8)
    sequential = encode_delta(tiny_model, TOKENS, kv, DeltaConfig(PreviousToken(4), "int8", 8))
    assert torch.allclose(warm.decoded, sequential.decoded, atol=1e-6)


def test_previous_token_beats_no_prediction_on_real_kv(real_model: CausalLM) -> None:
    tokens = real_model.encode_text("The lighthouse on the northern cape was built in 1874. "
                                    "Its keepers logged every ship that passed the point.")
    kv = real_model.kv_tensor(real_model.prefill(tokens))
    errors = {}
    for predictor in (NoPrediction(), PreviousToken(16)):
        decoded = compress_warm(real_model, kv, predictor=predictor, bits=3).decoded
        errors[predictor.name] = float((decoded - kv).square().sum() / kv.square().sum())
    assert errors["previous_token"] < errors["none"]


def test_wrong_model_is_refused(tiny_model: CausalLM, kv: torch.Tensor) -> None:
    data = compress_warm(tiny_model, kv).data
    other = tiny_random_llama(seed=1)
    with pytest.raises(ModelMismatchError, match="load it with the model that produced it"):
        decompress_warm(other, data)


def test_other_tokens_are_refused(tiny_model: CausalLM, kv: torch.Tensor) -> None:
    data = compress_warm(tiny_model, kv, tokens=TOKENS).data
    with pytest.raises(WarmTagMismatchError, match="stands for other tokens"):
        decompress_warm(tiny_model, data, tokens=[*TOKENS[:-1], 1])
    untagged = compress_warm(tiny_model, kv).data
    with pytest.raises(WarmTagMismatchError, match="has no tag"):
        decompress_warm(tiny_model, untagged, tag=Digest(b"\0" * 8))


def test_every_flipped_byte_is_refused(tiny_model: CausalLM, kv: torch.Tensor) -> None:
    data = compress_warm(tiny_model, kv, bits=2).data
    for position in range(0, len(data), 7):
        damaged = bytearray(data)
        damaged[position] ^= 0x40
        with pytest.raises((CorruptFileError, NotASeqKVFileError, TruncatedFileError)):
            decompress_warm(tiny_model, bytes(damaged))


def test_truncated_entry_is_refused(tiny_model: CausalLM, kv: torch.Tensor) -> None:
    data = compress_warm(tiny_model, kv).data
    with pytest.raises(TruncatedFileError):
        decompress_warm(tiny_model, data[:-9])


def _reframed(data: bytes, edit: int, value: bytes) -> bytes:
    """``data`` with ``value`` at payload offset ``edit`` and a valid checksum (a forgery)."""
    _, (header, payload) = unframe(data, MAGIC, {VERSION}, _ERRORS, "entry")
    changed = payload[:edit] + value + payload[edit + len(value):]
    return frame(MAGIC, VERSION, [header, changed])


def test_nan_scale_with_valid_checksum_is_refused(tiny_model: CausalLM,
                                                  kv: torch.Tensor) -> None:
    config = WarmConfig(NoPrediction(), "turboquant_mse", 4)
    codec = WarmCodec(config, tiny_model.geometry, len(TOKENS))
    data = compress_warm(tiny_model, kv, predictor=config.predictor, bits=4).data
    nan = struct.pack("<e", float("nan"))
    forged = _reframed(data, codec.code_bytes, nan)  # the first fp16 norm
    assert zlib.crc32(forged[:-4]) == struct.unpack("<I", forged[-4:])[0]
    with pytest.raises(CorruptFileError, match="NaN or infinite scale"):
        decompress_warm(tiny_model, forged)


def test_payload_of_another_length_is_refused(tiny_model: CausalLM) -> None:
    codec = WarmCodec(WarmConfig(), KVGeometry(2, 2, 16), 4)
    payloads, _ = codec.encode(torch.randn(1, 2, 2, 2, 4, 16))
    with pytest.raises(CorruptFileError, match="its config and geometry fix"):
        codec.decode([payloads[0][:-1]])


def test_config_preconditions() -> None:
    with pytest.raises(DeltaConfigError, match="without a model forward"):
        WarmConfig(TopKExpectation())  # type: ignore[arg-type]
    with pytest.raises(DeltaConfigError, match="codes residuals at"):
        WarmConfig(quantizer="int8", bits=3)
    with pytest.raises(DeltaConfigError, match="seed"):
        WarmConfig(seed=-1)


def test_kv_of_another_shape_is_refused(tiny_model: CausalLM, kv: torch.Tensor) -> None:
    with pytest.raises(InvalidKVError, match="this model's is"):
        compress_warm(tiny_model, kv[:1])
    with pytest.raises(InvalidKVError, match="tokens for KV"):
        compress_warm(tiny_model, kv, tokens=TOKENS[:-1])
    with pytest.raises(InvalidKVError, match="finite"):
        compress_warm(tiny_model, kv * float("inf"))


def test_batch_decode_equals_one_by_one() -> None:
    torch.manual_seed(0)
    codec = WarmCodec(WarmConfig(PreviousToken(4)), KVGeometry(3, 2, 16), 8)
    kv = torch.randn(5, 3, 2, 2, 8, 16)
    payloads, decoded = codec.encode(kv)
    alone = torch.cat([codec.decode([p]) for p in payloads])
    assert torch.allclose(alone, decoded, atol=1e-6)
    assert torch.equal(codec.decode(payloads), decoded)


def test_warm_model_of_a_loaded_model(tiny_model: CausalLM) -> None:
    warm = WarmModel.of(tiny_model)
    assert warm.geometry == tiny_model.geometry and len(warm.digest) == 8

"""The one closed loop (``seqkv.delta.closed_loop``) under both of its coders: the warm tier's
batched steps (``seqkv.warm.codec``) and the position-by-position delta code
(``seqkv.delta.delta_codec``).

The regression vectors are the bytes each coder wrote before the loop was shared (its own copy
of the loop in each coder), on a small seeded tensor with signed zeros, for quantizers that do
elementwise arithmetic only (int8, fp8), so the digests do not depend on a matrix product's
rounding. TurboQuant, whose rotation is a matrix product, is compared on this machine with the
warm codec's former loop, kept below as ``_former_warm_encode``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import pytest
import torch

import seqkv.delta.closed_loop as closed_loop
from seqkv.delta import DeltaConfig, decode_delta, encode_delta
from seqkv.delta.predictors import NoPrediction, PreviousToken
from seqkv.models import CausalLM
from seqkv.quantizers import PackedCodes, QuantizedTensor
from seqkv.types import KVGeometry
from seqkv.warm.codec import WarmCodec, _stored, _tensor_bytes
from seqkv.warm.config import WarmConfig

GEOMETRY = KVGeometry(2, 2, 16)
TOKENS = [5, 17, 17, 3, 9, 44]


def _kv(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Seeded normal values with signed zeros sprinkled in (``-0.0`` and ``0.0``)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    x.view(-1)[::11] = -0.0
    x.view(-1)[5::13] = 0.0
    return x


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:32]


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.int32).numpy().tobytes()


WARM_VECTORS = [
    (WarmConfig(PreviousToken(3, "previous"), "int8", 8), "380fb5a69f35dc9a5e456fdc0b7c1ea6"),
    (WarmConfig(PreviousToken(3, "anchor"), "fp8", 8), "5c8f1465c8a3a118ff2be9088651d8ef"),
    (WarmConfig(NoPrediction(), "int8", 8), "0572aad9bb5a33766a0dd8130eb6ee23"),
]
"""Payload digests the warm codec wrote with its own loop, on ``_kv((2, 2, 2, 2, 7, 16), 72)``."""

DELTA_VECTORS = [
    (DeltaConfig(PreviousToken(), "int8", 8), "7ae128d360923f860080d2db25aa82d3"),
    (DeltaConfig(NoPrediction(), "fp8", 8), "e1e19254b51ef16101ae557caedb8fd8"),
]
"""Digests of the range-coded words and every side tensor ``encode_delta`` wrote with its own
loop, on ``_kv((2, 2, 2, 6, 16), 46)``."""


def _warm_payloads(config: WarmConfig) -> tuple[list[bytes], torch.Tensor, WarmCodec]:
    codec = WarmCodec(config, GEOMETRY, 7)
    payloads, decoded = codec.encode(_kv((2, 2, 2, 2, 7, 16), 72))
    return payloads, decoded, codec


def _delta_digest(model: CausalLM, config: DeltaConfig) -> str:
    encoded = encode_delta(model, TOKENS, _kv((2, 2, 2, 6, 16), 46), config)
    sides = [_tensor_bytes(side.scales) for side in encoded.code.sides
             if side.scales is not None]
    return _digest(encoded.code.symbols.words, *sides)


@pytest.mark.parametrize(("config", "expected"), WARM_VECTORS, ids=lambda v: str(v))
def test_warm_bytes_are_those_of_its_former_loop(config: WarmConfig, expected: str) -> None:
    payloads, _, _ = _warm_payloads(config)
    assert _digest(*payloads) == expected


@pytest.mark.parametrize(("config", "expected"), DELTA_VECTORS, ids=lambda v: str(v))
def test_delta_bytes_are_those_of_its_former_loop(tiny_model: CausalLM, config: DeltaConfig,
                                                  expected: str) -> None:
    assert _delta_digest(tiny_model, config) == expected


def _open_loop(prediction: torch.Tensor, restored: torch.Tensor) -> torch.Tensor:
    """A defect: each step rebuilt without its prediction (no closed loop)."""
    return restored


def test_the_vectors_catch_an_open_loop(tiny_model: CausalLM,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(closed_loop, "_rebuilt", _open_loop)
    config, expected = WARM_VECTORS[0]
    assert _digest(*_warm_payloads(config)[0]) != expected
    delta, expected = DELTA_VECTORS[0]
    assert _delta_digest(tiny_model, delta) != expected


def _former_warm_encode(codec: WarmCodec, kv: torch.Tensor) -> list[bytes]:
    """``WarmCodec.encode``'s own loop before it ran ``seqkv.delta.closed_loop`` (the
    reference the shared loop must reproduce byte for byte)."""
    segments = kv.shape[0]
    decoded = torch.empty_like(kv)  # [n, L, 2, H, T, D]
    chunks: list[list[bytes]] = [[] for _ in range(segments)]
    for step, layout in zip(codec.steps, codec._layouts, strict=True):
        target = kv[..., step.positions, :]  # [n, L, 2, H, P, D]
        if step.references is None:
            predicted = torch.zeros(codec._step_shape(segments, step))
        else:
            predicted = decoded[..., step.references, :]
        q = codec.quantizer.quantize(target - predicted)
        decoded[..., step.positions, :] = predicted + codec.quantizer.dequantize(q)
        for (_, value), f in zip(_stored(q), layout, strict=True):
            data = _tensor_bytes(value.data if isinstance(value, PackedCodes) else value)
            for i in range(segments):
                chunks[i].append(data[i * f.nbytes : (i + 1) * f.nbytes])
    return [b"".join(c) for c in chunks]


@pytest.mark.parametrize("config", [
    WarmConfig(PreviousToken(4), "turboquant_mse", 3, 1),
    WarmConfig(PreviousToken(3, "anchor"), "turboquant_prod", 3),
    WarmConfig(NoPrediction(), "kivi", 2),
    *(config for config, _ in WARM_VECTORS),
], ids=lambda c: c.label)
def test_warm_bytes_match_the_former_loop_on_this_machine(config: WarmConfig) -> None:
    kv = _kv((3, 2, 2, 2, 9, 16), 7)
    codec = WarmCodec(config, GEOMETRY, 9)
    assert codec.encode(kv)[0] == _former_warm_encode(codec, kv)


@pytest.mark.parametrize("config", [config for config, _ in WARM_VECTORS], ids=lambda c: c.label)
def test_warm_decode_gives_the_encoders_bits_signed_zeros_included(config: WarmConfig) -> None:
    payloads, decoded, codec = _warm_payloads(config)
    assert _bits(codec.decode(payloads)) == _bits(decoded)


def _former_decode_loop(num_steps: int, code: Callable[[int], QuantizedTensor],
                        predictor: closed_loop.LoopPredictor,
                        quantizer: closed_loop.StepQuantizer) -> Iterator[torch.Tensor]:
    """A defect the warm decoder had: a step predicted as zero was not added to, so a ``-0.0``
    the encoder rebuilt as ``0.0 + -0.0 = 0.0`` came back ``-0.0``."""
    for step in range(num_steps):
        prediction = predictor.predict(step)
        restored = quantizer.dequantize(step, code(step))
        decoded = restored if not bool(prediction.any()) else prediction + restored
        predictor.observe(step, decoded)
        yield decoded


def test_the_signed_zero_check_catches_a_decoder_of_its_own(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    import seqkv.warm.codec as warm_codec

    monkeypatch.setattr(warm_codec, "decode_loop", _former_decode_loop)
    payloads, decoded, codec = _warm_payloads(WARM_VECTORS[1][0])
    restored = codec.decode(payloads)
    assert torch.equal(restored, decoded)  # equal as numbers: only the zeros' signs differ
    assert _bits(restored) != _bits(decoded)


@pytest.mark.parametrize("config", [config for config, _ in DELTA_VECTORS], ids=lambda c: c.label)
def test_delta_decode_gives_the_encoders_bits(tiny_model: CausalLM, config: DeltaConfig) -> None:
    encoded = encode_delta(tiny_model, TOKENS, _kv((2, 2, 2, 6, 16), 46), config)
    assert _bits(decode_delta(tiny_model, encoded.code).kv) == _bits(encoded.decoded)

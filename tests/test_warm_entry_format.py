"""The warm entry's layout in ``seqkv.formats.warm_entry``, the warm tier on it, and the
connector's shared pieces (one segment codec path, one budget in the eviction ledger).

The regression vectors are the bytes ``seqkv.warm.entry`` wrote while the layout lived there:
the move changed no byte.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import seqkv.warm as warm
from seqkv.delta.predictors import NoPrediction, PreviousToken
from seqkv.digests import Digest
from seqkv.errors import CorruptFileError, ModelMismatchError
from seqkv.eviction import ByteLRU
from seqkv.formats import warm_entry as layout
from seqkv.models import CausalLM
from seqkv.types import KVGeometry
from seqkv.warm import WarmModel
from seqkv.warm.config import EntryConfig, ExactConfig, WarmConfig
from seqkv.warm.entry import EntryHeader, read_entry, write_entry

MODEL = Digest(bytes(range(8)))
TAG = Digest(bytes(range(8, 16)))
GEOMETRY = KVGeometry(3, 2, 64)
VECTORS: list[tuple[EntryConfig, Digest | None, str]] = [
    (WarmConfig(PreviousToken(16, "anchor"), "turboquant_mse", 3, 300), TAG,
     "89534b5702021d0700010203040506070108090a0b0c0d0e0f0110010003ac02030240c8017061796c6f61641667"
     "ede3"),
    (WarmConfig(NoPrediction(), "int8", 8, 0), None,
     "89534b570202120700010203040506070000030800030240c8017061796c6f61646fbcbd42"),
    (ExactConfig("bfloat16"), TAG,
     "89534b570202180700010203040506070108090a0b0c0d0e0f0201030240c8017061796c6f6164077a8d05"),
]
"""``write_entry(EntryHeader(MODEL, tag, config, GEOMETRY, 200), b"payload")``, in version 2
of the layout, recorded when it moved into ``seqkv.formats``: a change of its bytes fails them."""


@pytest.mark.parametrize(("config", "tag", "expected"), VECTORS, ids=lambda v: str(v)[:24])
def test_entry_bytes_are_unchanged_by_the_move(config: EntryConfig, tag: Digest | None,
                                               expected: str) -> None:
    header = EntryHeader(MODEL, tag, config, GEOMETRY, 200)
    data = write_entry(header, b"payload")
    assert data.hex() == expected
    assert read_entry(data, WarmModel(MODEL, GEOMETRY), tag) == (header, b"payload")


def test_the_vectors_catch_a_changed_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that drops the reference byte of a previous-token coding fails the vector."""
    def without_reference(coding: layout.Coding) -> bytes:
        data = original(coding)
        return data[:2] + data[3:] if isinstance(coding, layout.LossyCoding) else data

    original = layout.coding_bytes
    monkeypatch.setattr(layout, "coding_bytes", without_reference)
    config, tag, expected = VECTORS[0]
    assert write_entry(EntryHeader(MODEL, tag, config, GEOMETRY, 200), b"payload").hex() != (
        expected)


@pytest.mark.parametrize("coding", [
    layout.ExactCoding(0), layout.ExactCoding(2),
    layout.LossyCoding(layout.NO_PREDICTION, 1, 0, 0, 3, 0),
    layout.LossyCoding(layout.PREVIOUS_TOKEN, 1 << 24, 1, 5, 8, 2 ** 40),
])
def test_the_layout_reads_what_it_writes(coding: layout.Coding) -> None:
    header = layout.EntryHeader(MODEL, None, coding, KVGeometry(1 << 20, 1, 2), 1 << 24)
    assert layout.read_entry(layout.write_entry(header, b"")) == (header, b"")


def test_ids_are_checked_before_the_model() -> None:
    """An entry naming a quantizer this seqkv lacks is refused as damage, whatever its model
    (``seqkv.warm.entry`` invariant 1)."""
    header = layout.EntryHeader(MODEL, None, layout.LossyCoding(0, 1, 0, 99, 3, 0), GEOMETRY, 4)
    data = layout.write_entry(header, b"")
    with pytest.raises(CorruptFileError, match="names unknown quantizer 99"):
        read_entry(data, WarmModel(TAG, GEOMETRY))
    known = layout.write_entry(
        layout.EntryHeader(MODEL, None, layout.LossyCoding(0, 1, 0, 0, 3, 0), GEOMETRY, 4), b"")
    with pytest.raises(ModelMismatchError):
        read_entry(known, WarmModel(TAG, GEOMETRY))


def test_the_layout_imports_neither_torch_nor_the_model_layer() -> None:
    code = ("import sys, seqkv.formats.warm_entry; print(sorted(m for m in sys.modules if "
            "m.split('.')[0] in ('torch', 'transformers') or m.startswith('seqkv.warm')))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True).stdout.strip()
    assert loaded == "[]"


def _decompress_with_its_own_codec(model: CausalLM, data: bytes) -> warm.WarmDecoded:
    """``decompress_warm`` as it was: its own choice of codec (the defect the spy catches)."""
    header, payload = read_entry(data, WarmModel.of(model))
    config = header.config
    codec: warm.WarmCodec | warm.ExactCodec = (
        warm.ExactCodec(config, header.geometry, header.num_tokens)
        if isinstance(config, ExactConfig) else
        warm.WarmCodec(config, header.geometry, header.num_tokens))
    kv = codec.decode([payload])[0]
    return warm.WarmDecoded(kv, config, warm._stats(codec, warm.header_bytes(header), payload,
                                                   data))


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[EntryConfig]:
    calls: list[EntryConfig] = []
    real = warm.segment_codec

    def spy(config: EntryConfig, geometry: KVGeometry, num_tokens: int
            ) -> warm.WarmCodec | warm.ExactCodec:
        calls.append(config)
        return real(config, geometry, num_tokens)

    monkeypatch.setattr(warm, "segment_codec", spy)
    return calls


def _codecs_used(model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> list[type]:
    """The configs ``segment_codec`` was asked for while a lossy and an exact entry were
    written and read back through ``seqkv.warm``."""
    kv = model.kv_tensor(model.prefill([5, 17, 3, 9]))
    calls = _spied(monkeypatch)
    results = [warm.compress_warm(model, kv, bits=2), warm.compress_exact(model, kv)]
    for result in results:
        assert torch.equal(warm.decompress_warm(model, result.data).kv, result.decoded)
    return [type(c) for c in calls]


def test_every_warm_entry_is_coded_through_segment_codec(tiny_model: CausalLM,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert _codecs_used(tiny_model, monkeypatch) == [WarmConfig, ExactConfig, WarmConfig,
                                                     ExactConfig]


def test_the_spy_catches_a_load_with_its_own_codec(tiny_model: CausalLM,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm, "decompress_warm", _decompress_with_its_own_codec)
    assert _codecs_used(tiny_model, monkeypatch) == [WarmConfig, ExactConfig]  # loads missing


def _evicts_nothing_for_an_entry_over_the_budget() -> bool:
    cache: ByteLRU[str, bytes] = ByteLRU(16, len)
    cache.put("a", b"1234")
    cache.put("b", b"5678")
    cache._ledger.budget_bytes = 8  # the budget changes in its one place
    cache.put("c", b"0123456789")  # over the budget: not kept, and nothing else goes for it
    return cache.get("c") is None and cache.get("a") is not None and cache.get("b") is not None


def test_byte_lru_reads_its_capacity_from_its_ledger() -> None:
    assert ByteLRU(16, len).capacity_bytes == 16
    assert _evicts_nothing_for_an_entry_over_the_budget()


def test_a_byte_lru_with_its_own_copy_of_the_budget_fails(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(ByteLRU, "capacity_bytes", property(lambda self: 16))
    assert not _evicts_nothing_for_an_entry_over_the_budget()



def test_the_exact_payload_layout() -> None:
    fields = layout.ExactPayload(TAG, b"\x78\x01zz", bytes(6))
    data = layout.write_exact_payload(TAG, b"\x78\x01zz", [bytes(2), bytes(4)])
    assert data.hex() == "08090a0b0c0d0e0f04" + "7801" + "7a7a" + "00" * 6
    assert layout.read_exact_payload(data, 6, "p") == fields
    with pytest.raises(CorruptFileError, match="p ends inside its low planes"):
        layout.read_exact_payload(data, 7, "p")
    with pytest.raises(CorruptFileError, match="p has 1 unexpected byte"):
        layout.read_exact_payload(data + b"\0", 6, "p")


def test_the_exact_codec_writes_the_layouts_payload() -> None:
    codec = warm.ExactCodec(ExactConfig("float16"), KVGeometry(2, 2, 16), 5)
    kv = torch.randn(2, 2, 2, 2, 5, 16, generator=torch.Generator().manual_seed(3)).half()
    for payload in codec.encode(kv)[0]:
        fields = layout.read_exact_payload(payload, codec.low_bytes, "p")
        assert layout.write_exact_payload(fields.digest, fields.top, [fields.low]) == payload
        assert len(fields.low) == kv[0].numel()  # one low byte a float16 value

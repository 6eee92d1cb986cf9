"""The store's codec seam: the .skv adapter against today's decompress, the tokens-only codec,
the span record format and the id rules."""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv import compress, decompress
from seqkv.container import decode_container
from seqkv.models import CausalLM
from seqkv.store.codec import PrefixState, SessionCodec
from seqkv.store.errors import CorruptRecordError, InvalidSessionIdError, StoreVerificationError
from seqkv.store.ids import SpanId, check_namespace, check_session_id, namespace_key
from seqkv.store.record import SpanRecord, frame_bytes, pack, unpack
from seqkv.store.skv_adapter import PortableTokenCodec, SkvCodec

LEVELS = ["tokens", "rows", "segments:3", "ngram", "plain"]


def _tokens(count: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [1] + [int(t) for t in torch.randint(3, 500, (count - 1,), generator=generator)]


@pytest.mark.parametrize("level", LEVELS)
def test_adapter_decodes_what_decompress_decodes(tiny_model: CausalLM, level: str) -> None:
    tokens = _tokens(30, 0)
    kv = tiny_model.kv_tensor(tiny_model.prefill(tokens))
    codec = SkvCodec(tiny_model, level)
    first = codec.encode(tokens[:18], kv[:, :, :, :18], None)
    (head,) = codec.decode_many([(first.payload, None)])
    assert head.tokens == tokens[:18]
    assert head.kv is not None
    if first.kv is not None:
        assert torch.equal(first.kv, head.kv)
    prefix = PrefixState(tuple(tokens[:18]), head.kv)
    target = torch.cat([head.kv, kv[:, :, :, 18:]], dim=3)
    second = codec.encode(tokens, target, prefix)
    tail, again = codec.decode_many([(second.payload, prefix), (first.payload, None)])
    assert tail.tokens == tokens[18:]
    assert again.tokens == tokens[:18]
    reference = decompress(tiny_model, compress(tiny_model, tokens[:18], kv=kv[:, :, :, :18],
                                                level=level).data)
    assert reference.tokens == head.tokens
    assert torch.equal(reference.kv, head.kv)


def test_adapter_payload_is_the_file_without_its_header(tiny_model: CausalLM) -> None:
    tokens = _tokens(40, 1)
    codec = SkvCodec(tiny_model, "ngram")
    encoded = codec.encode(tokens, None, None)
    data = compress(tiny_model, tokens, level="ngram").data
    container = decode_container(data)
    assert encoded.container_bytes == len(data)
    assert encoded.coded_bytes == len(container.token_code.data)
    # one varint byte (2 * 40 tokens + 1 < 128) and the tokens and KV digests: the rest of the
    # file (framing, level, vocabulary, model and profile digests) is the codec's, kept once
    assert len(encoded.payload) - encoded.coded_bytes == 1 + 8 + 8
    assert encoded.container_bytes - len(encoded.payload) >= 8 + 8


def test_adapter_refuses_a_payload_against_another_prefix(tiny_model: CausalLM) -> None:
    tokens = _tokens(24, 2)
    codec = SkvCodec(tiny_model, "plain")
    (head,) = codec.decode_many([(codec.encode(tokens[:12], None, None).payload, None)])
    prefix = PrefixState(tuple(tokens[:12]), head.kv)
    payload = codec.encode(tokens, None, prefix).payload
    assert head.kv is not None
    wrong = PrefixState(prefix.tokens, head.kv + 1e-3)
    with pytest.raises(StoreVerificationError):
        codec.decode_many([(payload, wrong)])


def test_codecs_satisfy_the_protocol(tiny_model: CausalLM) -> None:
    assert isinstance(SkvCodec(tiny_model), SessionCodec)
    assert isinstance(PortableTokenCodec(512), SessionCodec)
    assert SkvCodec(tiny_model, "rows").identity() != SkvCodec(tiny_model, "ngram").identity()


@pytest.mark.parametrize("level", ["plain", "ngram"])
def test_portable_codec_round_trips_with_a_prefix(level: str) -> None:
    codec = PortableTokenCodec(512, level)
    tokens = _tokens(50, 3)
    prefix = PrefixState(tuple(tokens[:20]), None)
    encoded = codec.encode(tokens, None, prefix)
    assert codec.decode_many([(encoded.payload, prefix)])[0].tokens == tokens[20:]
    if level == "plain":  # 9 bits per token, at most 2 bits of flush
        assert 30 * 9 <= 8 * encoded.coded_bytes <= 30 * 9 + 9


@given(st.integers(0, 300), st.integers(0, 2**40), st.integers(1, 2**20), st.booleans(),
       st.binary(max_size=64))
def test_record_round_trips(codec: int, parent: int, start: int, exact: bool,
                            payload: bytes) -> None:
    record = SpanRecord(codec, SpanId(parent) if parent else None, start if parent else 0,
                        exact, payload)
    assert unpack(pack(record)) == record
    assert frame_bytes(record) <= 1 + 2 + 6 + 3 + 4


def _packed() -> bytes:
    return pack(SpanRecord(1, SpanId(7), 12, True, b"payload"))


def test_truncated_record_is_refused() -> None:
    with pytest.raises(CorruptRecordError, match="truncated"):
        unpack(_packed()[:5])


def test_unknown_record_version_is_refused() -> None:
    with pytest.raises(CorruptRecordError, match="version"):
        unpack(b"\x91" + _packed()[1:])


def test_damaged_record_is_refused() -> None:
    data = bytearray(_packed())
    data[6] ^= 0x40
    with pytest.raises(CorruptRecordError, match="CRC32"):
        unpack(bytes(data))


@pytest.mark.parametrize("bad", ["", ".hidden", "a b", "x" * 129, "semi;colon", "é"])
def test_bad_session_ids_are_refused(bad: str) -> None:
    with pytest.raises(InvalidSessionIdError, match="not valid"):
        check_session_id(bad)


def test_non_string_namespace_is_refused() -> None:
    with pytest.raises(InvalidSessionIdError, match="is a str"):
        check_namespace(7)


def test_namespace_keys_differ_and_have_one_shape() -> None:
    keys = {namespace_key(check_namespace(n)) for n in ("a", "b", "tenant-1", "x" * 128)}
    assert len(keys) == 4 and {len(k) for k in keys} == {16}


@pytest.mark.parametrize("name", ["seqkv.store.ids", "seqkv.store.codec", "seqkv.store.index"])
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

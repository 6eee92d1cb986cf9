"""The store's codec seam: the model's codec against ``decompress``, the tokens-only codec and its
bounds, the span record format (version 2 written, version 1 read), a store written by the
previous release, and the id rules."""

from __future__ import annotations

import doctest
import importlib
import json
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv import compress, decompress
from seqkv.bounds import BoundViolationError
from seqkv.coding.arithmetic import BitStream
from seqkv.digests import Digest
from seqkv.errors import InvalidArgumentTypeError
from seqkv.formats.skv import read_skv
from seqkv.formats.span import SpanRecord, read_frame, read_span, span_parts, write_span
from seqkv.models import CausalLM
from seqkv.session import Prefix
from seqkv.store import ModelCodec, SessionStore, TokensCodec
from seqkv.store.backends.base import CodecIdentity
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.codec import EncodedSpan, SpanItem
from seqkv.store.errors import (
    CodecMismatchError,
    CorruptRecordError,
    InvalidSessionIdError,
    StoreVerificationError,
)
from seqkv.store.ids import check_namespace, check_session_id, namespace_key

LEVELS = ["tokens", "rows", "segments:3", "ngram", "plain", "portable"]
STORE_V1 = Path(__file__).parent / "data" / "store-v1"


def _tokens(count: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [1] + [int(t) for t in torch.randint(3, 500, (count - 1,), generator=generator)]


def _record(encoded: EncodedSpan, parent: int | None = None, start: int = 0) -> SpanRecord:
    session = encoded.session
    return SpanRecord(1, parent, start, encoded.kv_exact, session.count, session.tokens_digest,
                      session.kv_digest, session.dictionary, session.residual,
                      session.token_code)


def _stored(encoded: EncodedSpan, parent: int | None = None, start: int = 0) -> SpanRecord:
    """The record as the store writes and reads it back."""
    return read_span(write_span(_record(encoded, parent, start)))


@pytest.mark.parametrize("level", LEVELS)
def test_model_codec_decodes_what_decompress_decodes(tiny_model: CausalLM, level: str) -> None:
    tokens = _tokens(30, 0)
    kv = tiny_model.kv_tensor(tiny_model.prefill(tokens))
    codec = ModelCodec(tiny_model, level)
    first = codec.encode(tokens[:18], kv[:, :, :, :18], None, None)
    (head,) = codec.decode_many([SpanItem(_stored(first), None)])
    assert head.tokens == tokens[:18] and head.kv is not None
    assert first.kv is not None and torch.equal(first.kv, head.kv)
    prefix = Prefix(tuple(tokens[:18]), head.kv)
    target = torch.cat([head.kv, kv[:, :, :, 18:]], dim=3)
    second = codec.encode(tokens, target, prefix, None)
    tail, again = codec.decode_many([SpanItem(_stored(second, 1, 18), prefix),
                                     SpanItem(_stored(first), None)])
    assert tail.tokens == tokens and again.tokens == tokens[:18]  # the chain's, prefix too
    reference = decompress(tiny_model, compress(tiny_model, tokens[:18], kv=kv[:, :, :, :18],
                                                level=level).data)
    assert reference.tokens == head.tokens
    assert torch.equal(reference.kv, head.kv)


def test_a_span_is_the_coded_session_without_what_the_store_keeps_once(
        tiny_model: CausalLM) -> None:
    tokens = _tokens(40, 1)
    encoded = ModelCodec(tiny_model, "ngram").encode(tokens, None, None, None)
    data = compress(tiny_model, tokens, level="ngram").data
    assert encoded.session.token_code == read_skv(data).session.token_code
    record = write_span(_record(encoded))
    # head, four one-byte varints, the code's padding, the tokens and KV digests, the CRC:
    # nothing of the model, profile, level or vocabulary (the codec's identity, kept once per
    # store)
    assert len(record) - encoded.coded_bytes == 1 + 4 + 1 + 8 + 8 + 4
    assert sum(span_parts(_record(encoded)).values()) == len(record)


def test_a_span_refuses_another_prefix(tiny_model: CausalLM) -> None:
    tokens = _tokens(24, 2)
    codec = ModelCodec(tiny_model, "plain")
    (head,) = codec.decode_many([SpanItem(_stored(codec.encode(tokens[:12], None, None, None)),
                                          None)])
    assert head.kv is not None
    prefix = Prefix(tuple(tokens[:12]), head.kv)
    record = _stored(codec.encode(tokens, None, prefix, None), 1, 12)
    wrong = Prefix(prefix.tokens, head.kv + 1e-3)
    with pytest.raises(StoreVerificationError):
        codec.decode_many([SpanItem(record, wrong)])


def test_identities_differ_by_level_and_read_their_own(tiny_model: CausalLM) -> None:
    rows, ngram = ModelCodec(tiny_model, "rows"), ModelCodec(tiny_model, "ngram")
    assert rows.identity() != ngram.identity()
    assert rows.reader(rows.identity()) == (rows, None) and rows.reader(ngram.identity()) is None
    assert TokensCodec(512).reader(TokensCodec(512, "ngram").identity()) is None


def _as_if_coded_elsewhere(root: Path) -> None:
    """Rewrite a directory store's codec identities as another CPU model would have stored them
    (the only field that differs between two x86 machines of the same software)."""
    db = sqlite3.connect(root / "store.sqlite3", isolation_level=None)
    for index, text in db.execute("SELECT idx, description FROM codecs").fetchall():
        description = json.loads(text)
        description["profile"]["cpu_model"] = "ElsewhereCPU-99-1"
        moved = CodecIdentity.of(description)
        db.execute("UPDATE codecs SET digest = ?, description = ? WHERE idx = ?",
                   (moved.digest, moved.description, index))
    db.close()


@pytest.mark.parametrize("level", ["portable", "ngram", "plain"])
def test_a_store_coded_on_another_machine_reads_at_a_portable_level(
        tiny_model: CausalLM, tmp_path: Path, level: str) -> None:
    """Its tokens verify here and its KV is this worker's recomputation (not the encoder's, so
    not exact); an append is coded under this worker's own identity and reads back."""
    tokens = _tokens(24, 5)
    SessionStore.directory(tmp_path, tiny_model).put(
        "s", tokens, tiny_model.prefill(tokens), level=level, namespace="n")
    _as_if_coded_elsewhere(tmp_path)
    store = SessionStore.directory(tmp_path, tiny_model)
    got = store.get("s", namespace="n")
    assert got.tokens == tokens and not got.kv_exact and got.kv is not None
    store.append("s", [7, 8, 9], namespace="n")
    again = SessionStore.directory(tmp_path, tiny_model).get("s", namespace="n")
    assert again.tokens == [*tokens, 7, 8, 9]
    with pytest.raises(CodecMismatchError, match="another machine coded"):
        ModelCodec(tiny_model, level, coded_on=replace(
            tiny_model.profile("prefill"), cpu_model="x")).encode(tokens, None, None, None)


@pytest.mark.parametrize("level", ["ngram", "plain"])
def test_a_model_free_store_of_an_earlier_release_rebuilds_its_kv_on_its_schedule(
        tiny_model: CausalLM, tmp_path: Path, level: str, monkeypatch: pytest.MonkeyPatch,
        as_earlier_release: Callable[[str], None]) -> None:
    """Earlier releases computed these levels' KV with the row-invariant forward (the ``rows``
    schedule in the codec's profile): this worker rebuilds such a span's KV on that schedule,
    bit for bit what its encoder rebuilt (mutant: always the level's own schedule -> the
    prefill's KV), and codes a session extending it on its own schedule. A new span's KV is the
    caller's prefill, bit for bit (``kv_exact``); the old one's never was."""
    tokens = _tokens(24, 7)
    kv = tiny_model.prefill(tokens)
    as_earlier_release(level)
    SessionStore.directory(tmp_path, tiny_model).put("s", tokens, kv, level=level, namespace="n")
    rebuilt = compress(tiny_model, tokens, kv, level=level).kv
    monkeypatch.undo()
    store = SessionStore.directory(tmp_path, tiny_model)
    got = store.get("s", namespace="n")
    assert got.tokens == tokens and not got.kv_exact
    assert rebuilt is not None and got.kv is not None and got.kv.equal(rebuilt)
    store.put("u", tokens[::-1], tiny_model.prefill(tokens[::-1]), level=level, namespace="n")
    extended = [*tokens, 3, 1, 4]
    store.put("t", extended, tiny_model.prefill(extended), level=level, namespace="n")
    fresh = SessionStore.directory(tmp_path, tiny_model)
    got_all = fresh.get_many(["s", "t", "u"], namespace="n")
    assert [g.tokens for g in got_all] == [tokens, extended, tokens[::-1]]
    assert got_all[0].kv is not None and got_all[0].kv.equal(rebuilt) and got_all[2].kv_exact


@pytest.mark.parametrize("level", ["tokens", "rows"])
def test_a_store_coded_on_another_machine_is_refused_at_a_float_level(
        tiny_model: CausalLM, tmp_path: Path, level: str) -> None:
    """A float level's probabilities depend on the CPU: such spans are refused by name, not
    decoded (the checksums would catch a wrong token, but the store promises no such try)."""
    tokens = _tokens(20, 6)
    SessionStore.directory(tmp_path, tiny_model).put(
        "s", tokens, tiny_model.prefill(tokens), level=level, namespace="n")
    _as_if_coded_elsewhere(tmp_path)
    with pytest.raises(CodecMismatchError, match=r"ElsewhereCPU-99-1.*same execution profile"):
        SessionStore.directory(tmp_path, tiny_model).get("s", namespace="n")


@pytest.mark.parametrize("level", ["plain", "ngram"])
def test_tokens_codec_round_trips_with_a_prefix(level: str) -> None:
    codec = TokensCodec(512, level)
    tokens = _tokens(50, 3)
    prefix = Prefix(tuple(tokens[:20]), None)
    encoded = codec.encode(tokens, None, prefix, None)
    (decoded,) = codec.decode_many([SpanItem(_stored(encoded, 1, 20), prefix)])
    assert decoded.tokens == tokens  # the chain's, the prefix's included
    assert {b.name for b in encoded.bounds} >= {"code_within_table_cost"}
    if level == "plain":  # 9 bits per token, at most 2 bits of flush
        assert 30 * 9 <= 8 * encoded.coded_bytes <= 30 * 9 + 9


def test_tokens_codec_refuses_to_code_past_a_violated_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A coder that costs more than its tables say (here: one byte of junk after the code)
    fails the table-cost bound, and the store commits nothing."""
    import seqkv.store.codecs as codecs

    finish = codecs.ArithmeticEncoder.finish

    def padded(self: object) -> BitStream:
        code = finish(self)  # type: ignore[arg-type]
        return BitStream(code.data + b"\xff" * 4, code.num_bits + 32)

    monkeypatch.setattr(codecs.ArithmeticEncoder, "finish", padded)
    with pytest.raises(BoundViolationError, match="code_within_table_cost"):
        TokensCodec(512).encode(_tokens(20, 4), None, None, None)


@given(st.integers(0, 300), st.integers(0, 2**40), st.integers(1, 2**20), st.booleans(),
       st.integers(1, 5000), st.binary(min_size=8, max_size=8), st.booleans(),
       st.binary(max_size=64), st.integers(0, 7))
def test_span_records_round_trip(codec: int, parent: int, start: int, exact: bool, count: int,
                                 digest: bytes, with_kv: bool, code: bytes, padding: int) -> None:
    padding = padding if code else 0
    if code:  # the unused bits of the last byte are zeros
        code = code[:-1] + bytes([code[-1] & (0xFF << padding) & 0xFF])
    record = SpanRecord(codec, parent if parent else None, start if parent else 0, exact, count,
                        Digest(digest), Digest(digest[::-1]) if with_kv else None, None, None,
                        BitStream(code, 8 * len(code) - padding))
    data = write_span(record)
    assert read_span(data) == record
    assert sum(span_parts(record).values()) == len(data)


def _written() -> bytes:
    return write_span(SpanRecord(1, 7, 12, True, 3, Digest(bytes(8)), None, None, None,
                                 BitStream(b"code", 32)))


def test_truncated_record_is_refused() -> None:
    with pytest.raises(CorruptRecordError, match="truncated"):
        read_span(_written()[:5])


def test_unknown_record_version_is_refused() -> None:
    with pytest.raises(CorruptRecordError, match="version 9"):
        read_span(b"\x91" + _written()[1:])


def test_damaged_record_is_refused() -> None:
    data = bytearray(_written())
    data[6] ^= 0x40
    with pytest.raises(CorruptRecordError, match="CRC32"):
        read_span(bytes(data))


def test_the_parent_sits_where_the_redis_scripts_read_it() -> None:
    assert read_frame(_written()).parent == 7


@pytest.fixture
def store_v1(tmp_path: Path) -> Path:
    """A copy of a store written by the previous release (records of version 1)."""
    shutil.copytree(STORE_V1, tmp_path / "store")
    return tmp_path / "store"


def test_a_store_written_by_the_previous_release_still_reads(tiny_model: CausalLM,
                                                             store_v1: Path) -> None:
    """Sessions at portable (one extending another's prefix, one appended), ngram and
    portable+mix with a dictionary; and a tokens-only store: every version-1 record decodes. The
    upgrade to schema 3 drops the index keyed by the old hash (``seqkv.store.backends.base``
    invariant 8): a worker that never read an old session codes a new session extending it in
    full, as version 3, and the next one extending it is coded against it; a worker that read
    it holds its chain in its trie and codes against it."""
    tokens = json.loads((STORE_V1 / "tokens.json").read_text())
    reader = SessionStore.directory(store_v1 / "model", tiny_model)
    got = reader.get_many(["a", "b", "c", "d"], namespace="n")
    assert [g.tokens for g in got] == [tokens[k] for k in "abcd"]
    assert all(g.kv is not None for g in got)
    extended = tokens["a"] + [9, 9, 9]
    assert reader.find_prefix(extended, namespace="n").length == len(tokens["a"])
    store = SessionStore.directory(store_v1 / "model", tiny_model)
    result = store.put("e", extended, tiny_model.prefill(extended), namespace="n")
    assert result.shared_tokens == 0
    longer = [*extended, 7]
    assert store.put("f", longer, tiny_model.prefill(longer), namespace="n"
                     ).shared_tokens == len(extended)
    fresh = SessionStore.directory(store_v1 / "model", tiny_model)
    assert fresh.get("e", namespace="n").tokens == extended
    assert fresh.audit(namespace="n").consistent
    plain = SessionStore(DirectoryBackend(store_v1 / "tokens"), lambda _: TokensCodec(512))
    assert [g.tokens for g in plain.get_many(["p", "q"], namespace="n")] == [tokens["p"],
                                                                            tokens["q"]]


def test_a_version_1_record_is_read_only_with_its_codecs_layout(store_v1: Path) -> None:
    data = next((store_v1 / "model" / "records").rglob("1")).read_bytes()
    assert read_frame(data).version == 1
    with pytest.raises(CorruptRecordError, match="layout"):
        read_span(data)


@pytest.mark.parametrize("bad", ["", ".hidden", "a b", "x" * 129, "semi;colon", "é"])
def test_bad_session_ids_are_refused(bad: str) -> None:
    with pytest.raises(InvalidSessionIdError, match="not valid"):
        check_session_id(bad)


@pytest.mark.parametrize("bad", [".hidden", "a b", "x" * 129, "ns\udcff", "é"])
def test_bad_namespaces_are_refused_by_the_one_rule(bad: str) -> None:
    from seqkv.trie.keys import check_namespace as trie_namespace

    with pytest.raises(InvalidSessionIdError, match="not valid"):
        check_namespace(bad)
    with pytest.raises(ValueError, match="not valid"):
        trie_namespace(bad)


def test_non_string_namespace_is_a_type_error() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="is a str"):
        check_namespace(7)


def test_namespace_keys_differ_and_have_one_shape() -> None:
    keys = {namespace_key(check_namespace(n)) for n in ("a", "b", "tenant-1", "x" * 128, "")}
    assert len(keys) == 5 and {len(k) for k in keys} == {16}


@pytest.mark.parametrize("name", ["seqkv.store.ids", "seqkv.store.backends.base",
                                  "seqkv.store.index", "seqkv.namespaces",
                                  "seqkv.store.binding"])
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0



def test_a_put_that_violates_a_bound_raises_and_commits_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path checks (the proof-check issue): a store put at plain/ngram whose code is
    longer than its tables' cost raises ``BoundViolationError`` and stores nothing."""
    import seqkv.store.codecs as codecs

    store = SessionStore(DirectoryBackend(tmp_path / "s"), lambda level: TokensCodec(512, level))
    store.put("ok", _tokens(20, 5), level="plain", namespace="n")
    finish = codecs.ArithmeticEncoder.finish

    def padded(self: object) -> BitStream:
        code = finish(self)  # type: ignore[arg-type]
        return BitStream(code.data + b"\xff" * 4, code.num_bits + 32)

    monkeypatch.setattr(codecs.ArithmeticEncoder, "finish", padded)
    for level in ("plain", "ngram"):
        with pytest.raises(BoundViolationError, match="code_within_table_cost"):
            store.put(f"bad-{level}", _tokens(20, 6), level=level, namespace="n")
    assert store.list(namespace="n") == ["ok"]
    assert store.byte_counts(namespace="n").spans == 1


def test_a_model_put_records_theorem1_aggregates(tiny_model: CausalLM, tmp_path: Path) -> None:
    store = SessionStore.directory(tmp_path / "s", tiny_model)
    tokens = _tokens(24, 7)
    result = store.put("s", tokens, tiny_model.prefill(tokens), namespace="n")
    assert result.theorem1 is not None and result.theorem1.positions == 24
    plain = store.put("p", _tokens(10, 8), level="plain", namespace="n")
    assert plain.theorem1 is None  # the plain level's tables are not the model's

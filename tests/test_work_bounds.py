"""Issue 44, point 2: a decode's work is bounded by its bytes, at every level and reader.

A forged token count (the checksum recomputed) is refused as early as the format can tell:
before decoding where the level's tables give each token a known least number of bits and the
code's bit length is kept (``.skv`` format 5, span records of version 3,
``seqkv.levels.model_free`` invariant 3); by the information guard while decoding; by the
model-free caps where neither bounds it; and a model-free level's tokens are verified before
the KV prefill. Each guard is shown to be what refuses: with it removed (monkeypatched), the
same test fails (the decode runs on, a forward runs, or another check refuses later).
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqkv.coding import ngram
from seqkv.coding.arithmetic import ArithmeticDecoder, BitStream
from seqkv.digests import Digest
from seqkv.errors import CodeExhaustedError, DecodeLimitError, DecodeVerificationError
from seqkv.formats import span as span_format
from seqkv.formats.skv import read_skv, write_skv
from seqkv.formats.span import SpanRecord, read_frame, read_span, write_span
from seqkv.levels import NgramLevel, PlainLevel, model_free
from seqkv.limits import MAX_MODEL_FREE_WORK, MODEL_FREE_MAX_TOKENS
from seqkv.models import CausalLM
from seqkv.skv import compress, decompress, decompress_tokens
from seqkv.store import CorruptRecordError, SessionStore, TokensCodec, model_codecs
from seqkv.store.backends import redis as redis_backend
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.backends.redis import RedisBackend
from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.errors import StoreVerificationError
from store_records import record_bytes
from test_fuzz_record import as_version_2

TOKENS = [5, 17, 17, 3, 9, 10, 11, 12]
SESSION = [5 + (3 * i) % 400 for i in range(30)]
KINDS = ["directory", "redis"]
CODECS = ["tokens", "model"]


@pytest.fixture
def consumed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many symbols every decoder of the test consumed (counted, not timed)."""
    count = [0]
    consume = ArithmeticDecoder.consume

    def counting(self: ArithmeticDecoder, start: int, end: int) -> None:
        count[0] += 1
        consume(self, start, end)

    monkeypatch.setattr(ArithmeticDecoder, "consume", counting)
    yield count


def _forged(data: bytes, count: int, version: int | None = None) -> bytes:
    session = read_skv(data).session
    return write_skv(dataclasses.replace(session, count=count, segments=(count,)), version).data


@pytest.fixture(scope="module")
def files(tiny_model: CausalLM) -> dict[str, bytes]:
    return {level: compress(tiny_model, TOKENS, level=level).data for level in ("ngram", "plain")}


# -- .skv files ---------------------------------------------------------------------------------


def test_a_count_the_code_cannot_carry_is_refused_before_decoding(
        files: dict[str, bytes], consumed: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A format-5 plain file (9 bits a token at vocabulary 512) whose count says 100: its
    header keeps the code's bit length, so it is refused before a symbol; without that check the
    guard refuses it a few symbols past the code's end; without the guard too, all 100 decode."""
    forged = _forged(files["plain"], 100)
    with pytest.raises(CodeExhaustedError, match="cannot carry 100 tokens at the plain level"):
        decompress_tokens(forged)
    assert consumed[0] == 0
    monkeypatch.setattr(model_free, "within_code", lambda *args, **kwargs: True)
    with pytest.raises(CodeExhaustedError, match="run out"):
        decompress_tokens(forged)
    assert 0 < consumed[0] < 20
    consumed[0] = 0
    with pytest.raises(DecodeVerificationError):  # format 4 keeps no floor: no guard
        decompress_tokens(_forged(files["plain"], 100, version=4))
    assert consumed[0] == 100


def test_the_work_cap_refuses_before_any_table(files: dict[str, bytes], consumed: list[int],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the model, a count whose work (``decode_work``) is past the cap is refused
    before a table is built; with the cap's check removed, the decode runs."""
    level = NgramLevel()
    forged = _forged(files["ngram"], 40, version=4)
    monkeypatch.setattr(model_free, "MAX_MODEL_FREE_WORK", level.decode_work(512, 39, 39))
    with pytest.raises(DecodeLimitError, match="more work than a model-free decode allows"):
        decompress_tokens(forged)
    assert consumed[0] == 0
    monkeypatch.setattr(NgramLevel, "decode_work", lambda *args: 0)
    with pytest.raises(DecodeVerificationError):
        decompress_tokens(forged)
    assert consumed[0] == 40


def test_the_default_caps(files: dict[str, bytes]) -> None:
    """What the caps allow without the model: every count up to MODEL_FREE_MAX_TOKENS at
    plain; at ngram all of them at a vocabulary of 2, and at SmolLM2's 49,152 its context of
    8,192 tokens (any file its encoder writes), not one more."""
    plain, level = PlainLevel(), NgramLevel()
    assert plain.decode_work(1 << 18, MODEL_FREE_MAX_TOKENS,
                             MODEL_FREE_MAX_TOKENS) <= MAX_MODEL_FREE_WORK
    assert level.decode_work(2, MODEL_FREE_MAX_TOKENS, MODEL_FREE_MAX_TOKENS) \
        <= MAX_MODEL_FREE_WORK
    assert level.decode_work(49152, 8192, 8192) <= MAX_MODEL_FREE_WORK \
        < level.decode_work(49152, 8193, 8193)
    session = read_skv(files["ngram"]).session
    over = dataclasses.replace(session, vocab_size=49152, count=8193, segments=(8193,))
    with pytest.raises(DecodeLimitError, match="8,193 tokens over a vocabulary of 49,152"):
        decompress_tokens(write_skv(over, 4).data)


def test_positions_past_the_ngram_tables_are_refused(files: dict[str, bytes],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The ngram tables hold at most ``max_positions`` tokens of history (their weights sum
    below 2**30): a decode past it is refused by name before any table; without that check the
    table's own refusal, a ValueError, escapes (here with the weights' limit lowered to 1,024:
    no position past the vocabulary's 512)."""
    monkeypatch.setattr(ngram, "_MAX_TOTAL", 1024)
    assert NgramLevel().max_positions(512) == 0
    with pytest.raises(DecodeLimitError, match="reach at most 0 positions, not 8"):
        decompress_tokens(files["ngram"])
    monkeypatch.setattr(NgramLevel, "max_positions", lambda *args: 1 << 31)
    with pytest.raises(ValueError, match="not below 2"):
        decompress_tokens(files["ngram"])


def _no_forward(model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    def forward(*args: object, **kwargs: object) -> None:
        raise AssertionError("a forward ran")

    monkeypatch.setattr(model.model, "forward", forward)


def test_model_free_tokens_are_verified_before_the_kv_prefill(
        tiny_model: CausalLM, files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """A format-4 ngram file whose count says 100 (no guard): its tokens do not verify, and no
    forward runs for them; without the check before the prefill, the prefill runs."""
    forged = _forged(files["ngram"], 100, version=4)
    _no_forward(tiny_model, monkeypatch)
    with pytest.raises(DecodeVerificationError, match="decoded tokens do not match"):
        decompress(tiny_model, forged)
    request = model_free.decode_model_free

    def unchecked(source: model_free.ModelFreeLevel, model: CausalLM | None,
                  requests: list[model_free.DecodeRequest]) -> object:
        return request(source, model, [dataclasses.replace(r, check_tokens=None)
                                       for r in requests])

    monkeypatch.setattr(model_free, "decode_model_free", unchecked)
    with pytest.raises(AssertionError, match="a forward ran"):
        decompress(tiny_model, forged)


# -- span records -------------------------------------------------------------------------------


def _store(kind: str, codec: str, tmp_path: Path, server: RedisServer,
           model: CausalLM) -> SessionStore:
    backend = (DirectoryBackend(tmp_path / "store") if kind == "directory"
               else RedisBackend(server.url, f"w{uuid.uuid4().hex[:10]}"))
    codecs = (lambda level: TokensCodec(512, level)) if codec == "tokens" else model_codecs(model)
    return SessionStore(backend, codecs, hot_bytes=0)


def _put(store: SessionStore, codec: str, model: CausalLM, name: str, tokens: list[int],
         level: str) -> int:
    kv = None if codec == "tokens" else model.prefill(tokens)
    return int(store.put(name, tokens, kv, level=level, namespace="n").span)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_record_count_its_code_cannot_carry_is_refused(
        kind: str, codec: str, tmp_path: Path, redis_server: RedisServer,
        fuzz_model: CausalLM, consumed: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A version-3 plain record whose count says 100 (CRC recomputed): refused before a symbol
    is decoded; with that check removed, by the guard a few symbols past the code's end; read as
    a record that keeps no bit length (version 2), after decoding all 100."""
    store = _store(kind, codec, tmp_path, redis_server, fuzz_model)
    span = _put(store, codec, fuzz_model, "x", SESSION, "plain")
    record = read_span(record_bytes(store, span))
    assert record.code_form == "floored"
    record_bytes(store, span, write_span(dataclasses.replace(record, count=100)))
    with pytest.raises(CorruptRecordError, match="cannot carry 100 tokens at the plain level"):
        store.get("x", namespace="n")
    assert consumed[0] == 0
    monkeypatch.setattr(model_free, "within_code", lambda *args, **kwargs: True)
    with pytest.raises(CorruptRecordError, match="run out"):
        store.get("x", namespace="n")
    assert 0 < consumed[0] < 50
    consumed[0] = 0
    version2 = span_format._version2
    monkeypatch.setattr(span_format, "_version2", lambda frame, padded: dataclasses.replace(
        version2(frame, padded), code_form="bytes"))
    with pytest.raises(StoreVerificationError):
        store.get("x", namespace="n")
    assert consumed[0] == 100


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("kind", KINDS)
def test_records_of_version_2_still_read(kind: str, codec: str, tmp_path: Path,
                                         redis_server: RedisServer,
                                         fuzz_model: CausalLM) -> None:
    """A store whose records are all of version 2 (no code length) reads as written, extends,
    deletes (the Redis scripts read a version-2 record's parent) and audits consistent; a
    forged count there is bounded by the caps and the chain's digest."""
    store = _store(kind, codec, tmp_path, redis_server, fuzz_model)
    spans = [_put(store, codec, fuzz_model, name, tokens, "ngram") for name, tokens in
             (("x", SESSION), ("x2", [*SESSION, 1, 2, 3]))]
    for span in spans:
        record_bytes(store, span, as_version_2(record_bytes(store, span)))
        assert read_frame(record_bytes(store, span)).version == 2
        assert read_span(record_bytes(store, span)).code_form == "bytes"
    assert store.get("x2", namespace="n").tokens == [*SESSION, 1, 2, 3]
    assert store.get("x", namespace="n").tokens == SESSION
    _put(store, codec, fuzz_model, "x3", [*SESSION, 1, 2, 3, 4], "ngram")
    assert store.get("x3", namespace="n").tokens == [*SESSION, 1, 2, 3, 4]
    store.delete("x2", namespace="n")
    store.delete("x3", namespace="n")
    assert store.audit(namespace="n").consistent
    data = record_bytes(store, spans[0])
    record = read_span(data)
    forged = write_span(dataclasses.replace(record, count=60, code_form="floored"))
    record_bytes(store, spans[0], as_version_2(forged))
    with pytest.raises(StoreVerificationError):
        store.get("x", namespace="n")


@pytest.mark.parametrize("padding", [8, 255])
def test_a_record_padding_past_a_byte_is_refused(padding: int) -> None:
    data = bytearray(write_span(_record(BitStream(b"\xf0", 4))))
    at = 1 + 4  # head, four one-byte varints
    assert data[at] == 4
    data[at] = padding
    with pytest.raises(CorruptRecordError, match=f"{padding} unused bits"):
        read_span(_recrc(bytes(data)))


def test_record_padding_bits_that_are_not_zeros_are_refused() -> None:
    data = bytearray(write_span(_record(BitStream(b"\xf0", 4))))
    data[-5] = 0xF1  # the code's last byte: a padding bit set
    with pytest.raises(CorruptRecordError, match="not zeros"):
        read_span(_recrc(bytes(data)))
    empty = bytearray(write_span(_record(BitStream(b"", 0))))
    empty[5] = 3  # padding declared, no code
    with pytest.raises(CorruptRecordError, match="not zeros of a last byte"):
        read_span(_recrc(bytes(empty)))


def test_a_record_of_another_code_form_is_not_written_as_version_3() -> None:
    with pytest.raises(ValueError, match="floored token code"):
        write_span(dataclasses.replace(_record(BitStream(b"\x80", 1)), code_form="bytes"))


def _record(code: BitStream) -> SpanRecord:
    return SpanRecord(1, 7, 12, True, 3, Digest(bytes(8)), None, None, None, code)


def _recrc(data: bytes) -> bytes:
    body = data[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def test_the_redis_scripts_read_only_readable_record_versions(
        tmp_path: Path, redis_server: RedisServer, fuzz_model: CausalLM,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A record of version 9 in Redis: the server-side chain walk refuses it as malformed (it
    reads a parent only from a version ``read_frame`` reads); with that check removed from the
    scripts, the walk goes on and only Python's reader names the version."""
    store = _store("redis", "tokens", tmp_path, redis_server, fuzz_model)
    span = _put(store, "tokens", fuzz_model, "x", SESSION, "ngram")
    data = record_bytes(store, span)
    record_bytes(store, span, bytes([9 << 4 | data[0] & 0x0F]) + data[1:])
    with pytest.raises(CorruptRecordError, match="too short or malformed"):
        store.get("x", namespace="n")
    check = ("  if not span_versions[version] or (version == 1 and flags > 1) then return nil, "
             "false end\n")
    for name in ("_FETCH_SPAN", "_FETCH_SESSIONS"):
        source = getattr(redis_backend, name)
        assert check in source
        monkeypatch.setattr(redis_backend, name, source.replace(check, ""))
    backend = store.backend
    assert isinstance(backend, RedisBackend)
    unchecked = SessionStore(RedisBackend(redis_server.url, backend._prefix),
                             lambda level: TokensCodec(512, level), hot_bytes=0)
    with pytest.raises(CorruptRecordError, match="version 9"):
        unchecked.get("x", namespace="n")

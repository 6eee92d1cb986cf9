"""A store get does each piece of work once: every record of the chains it reads is parsed once
(one ``read_frame``, the Redis backend's where it walked the chain with it, and one
``read_span``), its codec looked up once (``for_index``), and a codec's decoded tokens are the
chain's, taken as they are (``seqkv.store.chains`` invariant 6).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import seqkv.store.backends.redis as redis_backend
import seqkv.store.chains as chains
from seqkv.store import SessionStore, TokensCodec
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.backends.redis import RedisBackend
from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.codec import DecodedSpan, SpanItem
from seqkv.store.errors import StoreVerificationError
from seqkv.store.registry import CodecRegistry

KINDS = ["directory", "redis"]
TURNS = [[5 + (3 * i) % 400 for i in range(12)], [7 + (5 * i) % 400 for i in range(9)],
         [11 + (7 * i) % 400 for i in range(10)]]


def _store(kind: str, tmp_path: Path, server: RedisServer) -> SessionStore:
    """A tokens-only store with no hot tier: every get decodes every span of its chain."""
    if kind == "directory":
        backend: DirectoryBackend | RedisBackend = DirectoryBackend(
            tmp_path / f"store-{uuid.uuid4().hex}")
    else:
        backend = RedisBackend(server.url, prefix=f"p{uuid.uuid4().hex[:10]}")
    return SessionStore(backend, lambda level: TokensCodec(512, level), hot_bytes=0)


def _chained(store: SessionStore) -> list[int]:
    """Session "s" as a chain of three spans (a put, then two appends), and session "t", a
    fourth span continuing the first two; returns the tokens of "s"."""
    store.put("s", TURNS[0], level="ngram", namespace="n")
    store.append("s", TURNS[1], namespace="n")
    store.put("t", [*TURNS[0], *TURNS[1], 3, 4, 5], level="ngram", namespace="n")
    store.append("s", TURNS[2], namespace="n")
    return [*TURNS[0], *TURNS[1], *TURNS[2]]


def _counted(monkeypatch: pytest.MonkeyPatch, calls: Counter[str]) -> None:
    """Count the parses of records and the codec look-ups from here on."""

    def counting(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return function(*args, **kwargs)
        return counted

    monkeypatch.setattr(chains, "read_frame", counting("read_frame", chains.read_frame))
    monkeypatch.setattr(redis_backend, "read_frame",
                        counting("read_frame", redis_backend.read_frame))
    monkeypatch.setattr(chains, "read_span", counting("read_span", chains.read_span))
    monkeypatch.setattr(CodecRegistry, "for_index",
                        counting("for_index", CodecRegistry.for_index))


def _assert_each_record_parsed_once(store: SessionStore, monkeypatch: pytest.MonkeyPatch,
                                    names: Sequence[str], spans: int) -> None:
    calls: Counter[str] = Counter()
    with monkeypatch.context() as patch:
        _counted(patch, calls)
        got = store.get_many(names, namespace="n")
    assert len(got) == len(names)
    assert calls == {"read_frame": spans, "read_span": spans, "for_index": spans}, calls


@pytest.mark.parametrize("kind", KINDS)
def test_a_get_parses_each_record_of_its_chain_once(
        kind: str, tmp_path: Path, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(kind, tmp_path, redis_server)
    tokens = _chained(store)
    assert store.stat("s", namespace="n").spans == 3
    assert store.stat("t", namespace="n").spans == 3  # the first two of "s", then its own
    assert store.get("s", namespace="n").tokens == tokens
    # "s": its three spans, the last read for the row's limit, its decode and the row's check
    _assert_each_record_parsed_once(store, monkeypatch, ["s"], 3)
    # "s" and "t" share two spans: four records in all, each parsed once
    _assert_each_record_parsed_once(store, monkeypatch, ["s", "t"], 4)


@pytest.mark.parametrize("kind", KINDS)
def test_the_count_fails_when_records_are_parsed_again(
        kind: str, tmp_path: Path, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a ``SpanRecords`` that parses on every call (no cache) is caught."""
    store = _store(kind, tmp_path, redis_server)
    _chained(store)
    monkeypatch.setattr(chains.SpanRecords, "get",
                        lambda self, stored: self._decoder.read(stored))
    with pytest.raises(AssertionError, match="read_span"):
        _assert_each_record_parsed_once(store, monkeypatch, ["s"], 3)


def test_the_count_fails_when_the_backends_frames_are_read_again(
        tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a decoder that reads again the frames the Redis backend walked with."""
    store = _store("redis", tmp_path, redis_server)
    _chained(store)
    read = chains.ChainDecoder.read
    monkeypatch.setattr(chains.ChainDecoder, "read",
                        lambda self, stored: read(self, dataclasses.replace(stored, frame=None)))
    with pytest.raises(AssertionError, match="read_frame"):
        _assert_each_record_parsed_once(store, monkeypatch, ["s", "t"], 4)


def test_a_codec_that_returns_only_the_span_tokens_is_refused(
        tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant 6 of ``seqkv.store.chains``: a codec keeping the former contract (the tokens
    after the prefix) would give a chain state without its prefix; it is refused instead."""
    store = _store("directory", tmp_path, redis_server)
    _chained(store)
    decode = TokensCodec.decode_many

    def tail_only(self: TokensCodec, items: Sequence[SpanItem]) -> list[DecodedSpan]:
        return [DecodedSpan(result.tokens[item.record.start:], result.kv, result.kv_exact)
                for item, result in zip(items, decode(self, items), strict=True)]

    monkeypatch.setattr(TokensCodec, "decode_many", tail_only)
    with pytest.raises(StoreVerificationError, match="the prefix's included"):
        store.get("s", namespace="n")

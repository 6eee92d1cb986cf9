"""SessionStore on both backends: round trips, sharing, append, refcounts, tenants, collisions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqkv.errors import EmptyInputError, InvalidKVError
from seqkv.mixing.dictionary import Dictionary
from seqkv.models import CausalLM
from seqkv.session import Prefix
from seqkv.store.backends.base import CodecIdentity
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.backends.redis import RedisBackend
from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.codec import DecodedSpan, EncodedSpan, SpanCodec, SpanItem, StoredReader
from seqkv.store.codecs import ModelCodec, TokensCodec
from seqkv.store.errors import SessionExistsError, SessionNotFoundError
from seqkv.store.ids import SessionName, check_namespace, namespace_key
from seqkv.store.index import IndexSpacing
from seqkv.store.registry import CodecFactory, model_codecs
from seqkv.store.store import SessionStore

KINDS = ["directory", "redis"]
NS = namespace_key(check_namespace("n"))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server on a free 127.0.0.1 port; a missing binary fails the tests."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


def make_store(kind: str, tmp_path: Path, server: RedisServer, codecs: CodecFactory,
               spacing: IndexSpacing | None = None, hot_bytes: int = 1 << 28) -> SessionStore:
    if kind == "directory":
        backend: DirectoryBackend | RedisBackend = DirectoryBackend(
            tmp_path / f"store-{uuid.uuid4().hex}")
    else:
        backend = RedisBackend(server.url, prefix=f"t{uuid.uuid4().hex}")
    return SessionStore(backend, codecs, spacing=spacing, hot_bytes=hot_bytes)


def _tokens(count: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(3, 500, (count,), generator=generator)]


SYSTEM = [1, *_tokens(40, 100)]


def _portable(level: str) -> TokensCodec:
    return TokensCodec(512, "plain" if level == "plain" else "ngram")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("level", ["rows", "ngram"])
def test_round_trip_with_a_shared_prefix(kind: str, level: str, tiny_model: CausalLM,
                                         tmp_path: Path, redis_server: RedisServer) -> None:
    store = make_store(kind, tmp_path, redis_server, model_codecs(tiny_model))
    first = [*SYSTEM, *_tokens(12, 1)]
    second = [*SYSTEM, *_tokens(9, 2)]
    kv_first = tiny_model.kv_tensor(tiny_model.prefill(first))
    put_first = store.put("a", first, kv_first, level=level, namespace="n")
    put_second = store.put("b", second, tiny_model.prefill(second), level=level, namespace="n")
    assert (put_first.shared_tokens, put_second.shared_tokens) == (0, len(SYSTEM))
    assert put_second.coded_tokens == 9
    assert put_second.record_bytes < put_first.record_bytes
    cold = SessionStore(store.backend, model_codecs(tiny_model))
    got_first, got_second = cold.get_many(["a", "b"], namespace="n")
    assert (got_first.tokens, got_second.tokens) == (first, second)
    assert got_first.kv is not None and got_first.cache is not None
    assert got_first.kv.shape == kv_first.shape
    assert (got_first.kv - kv_first).abs().max() <= 1e-4
    stat = cold.stat("b", namespace="n")
    assert (stat.tokens, stat.spans, stat.shared_prefix_bytes) == (
        len(second), 2, put_first.record_bytes)
    assert cold.audit(namespace="n").consistent


@pytest.mark.parametrize("kind", KINDS)
def test_append_codes_only_the_new_tokens(kind: str, tiny_model: CausalLM, tmp_path: Path,
                                          redis_server: RedisServer) -> None:
    store = make_store(kind, tmp_path, redis_server, model_codecs(tiny_model))
    turn = [*SYSTEM, *_tokens(10, 3)]
    store.put("chat", turn, level="rows", namespace="n")
    before = store.backend.fetch_sessions(NS, [SessionName("chat")])[0]
    more = _tokens(7, 4)
    kv = tiny_model.kv_tensor(tiny_model.prefill(turn + more))
    result = store.append("chat", more, kv[:, :, :, len(turn):], namespace="n")
    assert (result.coded_tokens, result.shared_tokens) == (7, len(turn))
    after = store.backend.fetch_sessions(NS, [SessionName("chat")])[0]
    assert before is not None and after is not None
    assert after.chain[: len(before.chain)] == before.chain  # earlier turns never re-coded
    got = SessionStore(store.backend, model_codecs(tiny_model)).get("chat", namespace="n")
    assert got.tokens == turn + more
    assert got.kv is not None and (got.kv[:, :, :, len(turn):] - kv[:, :, :, len(turn):]
                                   ).abs().max() <= 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_a_session_inside_another_costs_no_record(kind: str, tiny_model: CausalLM,
                                                  tmp_path: Path,
                                                  redis_server: RedisServer) -> None:
    store = make_store(kind, tmp_path, redis_server, model_codecs(tiny_model))
    long = [*SYSTEM, *_tokens(30, 5)]
    store.put("long", long, level="ngram", namespace="n")
    short = store.put("short", long[:50], level="ngram", namespace="n")
    assert (short.record_bytes, short.shared_tokens) == (0, 50)
    store.delete("long", namespace="n")
    cold = SessionStore(store.backend, model_codecs(tiny_model))
    assert cold.get("short", namespace="n").tokens == long[:50]
    assert cold.list(namespace="n") == ["short"]


@pytest.mark.parametrize("kind", KINDS)
def test_tenants_share_nothing_and_learn_nothing(kind: str, tiny_model: CausalLM,
                                                 tmp_path: Path,
                                                 redis_server: RedisServer) -> None:
    store = make_store(kind, tmp_path, redis_server, model_codecs(tiny_model))
    tokens = [*SYSTEM, *_tokens(5, 6)]
    with pytest.raises(SessionNotFoundError) as never:
        store.get("s1", namespace="bob")
    store.put("s1", tokens, level="ngram", namespace="alice")
    with pytest.raises(SessionNotFoundError) as elsewhere:
        store.get("s1", namespace="bob")
    assert str(never.value) == str(elsewhere.value)
    assert store.put("s1", tokens, level="ngram", namespace="bob").shared_tokens == 0
    assert store.list(namespace="carol") == []
    store.delete("s1", namespace="alice")
    assert store.get("s1", namespace="bob").tokens == tokens


@pytest.mark.parametrize("kind", KINDS)
def test_colliding_index_keys_never_share_a_wrong_prefix(kind: str, tmp_path: Path,
                                                         redis_server: RedisServer) -> None:
    spacing = IndexSpacing(first=2, step=4, key_bytes=1)  # 256 keys: collisions everywhere
    store = make_store(kind, tmp_path, redis_server, _portable, spacing, hot_bytes=0)
    sessions = {f"s{i}": [*SYSTEM[: 3 + i % 7], *_tokens(20 + i % 5, 200 + i)]
                for i in range(40)}
    for name, tokens in sessions.items():
        result = store.put(name, tokens, level="ngram", namespace="n")
        assert result.candidates <= 3
    cold = SessionStore(store.backend, _portable, spacing=spacing)
    names = sorted(sessions)
    assert [s.tokens for s in cold.get_many(names, namespace="n")] == [
        sessions[n] for n in names]
    assert cold.audit(namespace="n").consistent


@pytest.mark.parametrize("kind", KINDS)
def test_preconditions(kind: str, tiny_model: CausalLM, tmp_path: Path,
                       redis_server: RedisServer) -> None:
    store = make_store(kind, tmp_path, redis_server, model_codecs(tiny_model))
    store.put("x", SYSTEM, level="plain", namespace="n")
    with pytest.raises(SessionExistsError, match="already holds"):
        store.put("x", SYSTEM, level="plain", namespace="n")
    with pytest.raises(EmptyInputError):
        store.put("y", [], level="plain", namespace="n")
    with pytest.raises(InvalidKVError, match="holds 3 tokens"):
        store.put("y", SYSTEM, torch.zeros(2, 2, 2, 3, 16), level="plain", namespace="n")
    with pytest.raises(SessionNotFoundError, match="no session 'y'"):
        store.delete("y", namespace="n")
    with pytest.raises(SessionNotFoundError, match="no session 'y'"):
        store.append("y", [5], namespace="n")
    with pytest.raises(EmptyInputError):
        store.append("x", [], namespace="n")


_OPS = st.lists(st.tuples(st.sampled_from(["put", "append", "delete"]), st.integers(0, 5),
                          st.integers(0, 3), st.integers(1, 12)), min_size=1, max_size=25)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_refcounts_equal_a_recount_after_any_operations(
        kind: str, tmp_path: Path, redis_server: RedisServer,
        ops: list[tuple[str, int, int, int]]) -> None:
    store = make_store(kind, tmp_path, redis_server, _portable, IndexSpacing(first=4, step=8))
    model: dict[str, list[int]] = {}
    bases = [_tokens(24, 300 + b) for b in range(4)]
    for op, who, base, size in ops:
        name = f"s{who}"
        if op == "put" and name not in model:
            tokens = bases[base][: 4 * base + 4] + _tokens(size, 400 + who * 31 + size)
            store.put(name, tokens, level="ngram", namespace="n")
            model[name] = tokens
        elif op == "append" and name in model:
            added = _tokens(size, 500 + who * 17 + size)
            store.append(name, added, namespace="n")
            model[name] += added
        elif op == "delete" and name in model:
            store.delete(name, namespace="n")
            del model[name]
        audit = store.audit(namespace="n")
        assert audit.consistent and audit.orphan_records == 0
        assert audit.sessions == len(model)
    cold = SessionStore(store.backend, _portable)
    names = sorted(model)
    assert [s.tokens for s in cold.get_many(names, namespace="n")] == [model[n] for n in names]
    for name in names:
        store.delete(name, namespace="n")
    store.gc(namespace="n")
    audit = store.audit(namespace="n")
    assert (audit.spans, audit.index_entries, audit.sessions) == (0, 0, 0)
    counts = store.byte_counts(namespace="n")
    assert (counts.records, counts.index, counts.refcounts) == (0, 0, 0)


def test_hot_tier_keeps_its_budget() -> None:
    from seqkv.store.hot import ChainState, HotTier
    from seqkv.store.ids import NamespaceKey, SpanId

    tier = HotTier(capacity_bytes=3 * 8 * 10)
    root = ("s", NamespaceKey(b"n"))
    for span in range(5):  # five chains of 10 tokens that share none: 80 bytes each
        tier.put(root, ChainState(tuple(range(100 * span, 100 * span + 10)), None, None,
                                  ((SpanId(span), 0),)))
        assert tier.nbytes <= 240
    assert len(tier.trie) == 3
    assert tier.state(root, SpanId(0)) is None
    assert tier.state(root, SpanId(4)) is not None


class _CountingCodec:
    """Wraps a codec and records the batch size of every ``decode_many`` call."""

    def __init__(self, inner: SpanCodec) -> None:
        self.inner = inner
        self.batches: list[int] = []

    def identity(self) -> CodecIdentity:
        return self.inner.identity()

    def reader(self, identity: CodecIdentity) -> StoredReader | None:
        found = self.inner.reader(identity)
        return None if found is None else (self, found[1])

    @property
    def mixes(self) -> bool:
        return self.inner.mixes

    @property
    def uses_kv(self) -> bool:
        return self.inner.uses_kv

    @property
    def max_prefix_error(self) -> float:
        return self.inner.max_prefix_error

    @property
    def max_tokens(self) -> int | None:
        return self.inner.max_tokens

    def encode(self, tokens: Sequence[int], kv: torch.Tensor | None, prefix: Prefix | None,
               dictionary: Dictionary | None) -> EncodedSpan:
        return self.inner.encode(tokens, kv, prefix, dictionary)

    def decode_many(self, items: Sequence[SpanItem]) -> list[DecodedSpan]:
        self.batches.append(len(items))
        return self.inner.decode_many(items)


def test_get_many_decodes_sibling_spans_in_one_batch(tiny_model: CausalLM,
                                                    tmp_path: Path) -> None:
    counting = _CountingCodec(ModelCodec(tiny_model, "rows"))
    store = SessionStore(DirectoryBackend(tmp_path / "s"), lambda level: counting)
    for index in range(3):
        store.put(f"s{index}", [*SYSTEM, *_tokens(6, 700 + index)], level="rows",
                  namespace="n")
    cold = SessionStore(store.backend, lambda level: counting)
    counting.batches.clear()
    got = cold.get_many(["s0", "s1", "s2"], namespace="n")
    assert [len(s.tokens) for s in got] == [len(SYSTEM) + 6] * 3
    # s0's span holds the shared prefix and s0's tail; s1 and s2 continue it, decoded together
    assert counting.batches == [1, 2]

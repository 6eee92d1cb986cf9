"""The store's own mixing dictionaries, per namespace (issue 16), and its default level (issue 15).

Both backends, the tiny model: a namespace's dictionary codes its portable+mix sessions and
decodes them on a cold worker; another namespace can neither store, code with nor decode with
it, and learns nothing from the errors; gc keeps what stored sessions need.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seqkv.formats.span import SpanRecord, read_frame, read_span, write_span
from seqkv.mixing import Dictionary, build_dictionary
from seqkv.mixing.errors import DictionaryUnavailableError
from seqkv.models import CausalLM
from seqkv.store import (
    DEFAULT_STORE_LEVEL,
    DictionaryNamespaceError,
    ModelCodec,
    SessionStore,
    SpanItem,
    model_codecs,
)
from seqkv.store.backends.base import CommitPlan, DictionaryGoneError
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.backends.redis import RedisBackend
from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.binding import session_binding
from seqkv.store.ids import SessionName, check_namespace, namespace_key

KINDS = ["directory", "redis"]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server on a free 127.0.0.1 port; a missing binary fails the tests."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


def _backend(kind: str, tmp_path: Path, server: RedisServer) -> DirectoryBackend | RedisBackend:
    if kind == "directory":
        return DirectoryBackend(tmp_path / f"store-{uuid.uuid4().hex}")
    return RedisBackend(server.url, prefix=f"t{uuid.uuid4().hex}")


def _tokens(count: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(3, 500, (count,), generator=generator)]


DOCUMENT = _tokens(48, 11)
OTHER_DOCUMENT = _tokens(48, 12)
# A session that quotes most of the document: the dictionary predicts it.
QUOTING = [1, *_tokens(4, 13), *DOCUMENT[:36], *_tokens(3, 14)]


def _dictionary(namespace: str, document: list[int] = DOCUMENT) -> Dictionary:
    return build_dictionary([document], 512, namespace=namespace)


def _named_digest(store: SessionStore, model: CausalLM, namespace: str,
                  session: str) -> str | None:
    """The dictionary digest that the last span of ``session`` names."""
    ns = namespace_key(check_namespace(namespace))
    (found,) = store.backend.fetch_sessions(ns, [SessionName(session)])
    assert found is not None
    return read_span(found.chain[-1].record).dictionary


def _store(kind: str, tmp_path: Path, server: RedisServer, model: CausalLM) -> SessionStore:
    return SessionStore(_backend(kind, tmp_path, server), model_codecs(model))


def _cold(store: SessionStore, model: CausalLM) -> SessionStore:
    """Another worker on the same backend: nothing hot, no dictionary cached."""
    return SessionStore(store.backend, model_codecs(model))


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_with_the_namespace_dictionary(kind: str, tiny_model: CausalLM,
                                                   tmp_path: Path,
                                                   redis_server: RedisServer) -> None:
    store = _store(kind, tmp_path, redis_server, tiny_model)
    dictionary = _dictionary("a")
    stored = store.put_dictionary(dictionary, namespace="a")
    assert (stored.digest, stored.created, stored.tokens) == (dictionary.digest, True, 48)
    assert store.put_dictionary(dictionary, namespace="a").created is False
    kv = tiny_model.kv_tensor(tiny_model.prefill(QUOTING))
    mixed = store.put("mixed", QUOTING, kv, level="portable+mix", namespace="a")
    plain = store.put("plain", QUOTING, kv, level="portable", namespace="x")
    assert mixed.coded_bytes < plain.coded_bytes  # the dictionary predicted the quote
    assert _named_digest(store, tiny_model, "a", "mixed") == dictionary.digest
    assert _named_digest(store, tiny_model, "x", "plain") is None
    cold = _cold(store, tiny_model)
    got = cold.get("mixed", namespace="a")
    assert got.tokens == QUOTING
    assert got.kv is not None and (got.kv - kv).abs().max() <= 1e-4
    assert cold.current_dictionary(namespace="a") is not None
    assert cold.dictionaries(namespace="a") == [dictionary.digest]
    assert cold.audit(namespace="a").consistent


@pytest.mark.parametrize("kind", KINDS)
def test_append_codes_with_the_current_dictionary(kind: str, tiny_model: CausalLM,
                                                  tmp_path: Path,
                                                  redis_server: RedisServer) -> None:
    store = _store(kind, tmp_path, redis_server, tiny_model)
    first, second = _dictionary("a"), _dictionary("a", OTHER_DOCUMENT)
    store.put_dictionary(first, namespace="a")
    store.put("chat", QUOTING, level="portable+mix", namespace="a")
    store.put_dictionary(second, namespace="a")
    turn = OTHER_DOCUMENT[:20]
    result = store.append("chat", turn, namespace="a")
    assert (result.shared_tokens, result.coded_tokens) == (len(QUOTING), len(turn))
    assert _named_digest(store, tiny_model, "a", "chat") == second.digest
    got = _cold(store, tiny_model).get("chat", namespace="a")
    assert got.tokens == QUOTING + turn  # its two spans decode with their two dictionaries


@pytest.mark.parametrize("kind", KINDS)
def test_a_namespace_never_uses_another_namespaces_dictionary(
        kind: str, tiny_model: CausalLM, tmp_path: Path, redis_server: RedisServer) -> None:
    store = _store(kind, tmp_path, redis_server, tiny_model)
    with pytest.raises(DictionaryUnavailableError) as never:
        store.put("s", QUOTING, level="portable+mix", namespace="b")
    dictionary = _dictionary("a")
    store.put_dictionary(dictionary, namespace="a")
    with pytest.raises(DictionaryUnavailableError) as elsewhere:
        store.put("s", QUOTING, level="portable+mix", namespace="b")
    assert str(never.value) == str(elsewhere.value)
    with pytest.raises(DictionaryNamespaceError, match="built for namespace 'a'"):
        store.put_dictionary(dictionary, namespace="b")
    assert store.dictionaries(namespace="b") == []
    assert store.current_dictionary(namespace="b") is None
    assert store.list(namespace="b") == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_span_naming_another_namespaces_dictionary_does_not_decode(
        kind: str, tiny_model: CausalLM, tmp_path: Path, redis_server: RedisServer) -> None:
    store = _store(kind, tmp_path, redis_server, tiny_model)
    store.put_dictionary(_dictionary("a"), namespace="a")
    store.put("s", QUOTING, level="portable+mix", namespace="a")
    store.get("s", namespace="a")  # decoded: this worker now holds a's dictionary in memory
    # A copy of a's record in b (as a tenant with raw backend access could make, its row's
    # binding recomputed) names a's dictionary; b does not hold it.
    a, b = (namespace_key(check_namespace(n)) for n in "ab")
    (found,) = store.backend.fetch_sessions(a, [SessionName("s")])
    assert found is not None and len(found.chain) == 1
    kv_digest = read_span(found.chain[0].record).kv_digest
    store.backend.commit(b, CommitPlan(
        SessionName("s"), len(QUOTING), None, found.chain[0].record, None, (),
        binding=lambda span: session_binding(b, SessionName("s"), len(QUOTING), span, QUOTING,
                                             kv_digest)))
    with pytest.raises(DictionaryUnavailableError) as elsewhere:
        store.get("s", namespace="b")
    # Make the dictionary exist nowhere: a drops the session, replaces it as current, collects.
    store.delete("s", namespace="a")
    store.put_dictionary(_dictionary("a", OTHER_DOCUMENT), namespace="a")
    assert store.gc(namespace="a").dictionaries_removed == 1
    with pytest.raises(DictionaryUnavailableError) as never:
        _cold(store, tiny_model).get("s", namespace="b")
    assert str(elsewhere.value) == str(never.value)
    assert "does not hold" in str(never.value)


@pytest.mark.parametrize("kind", KINDS)
def test_gc_keeps_referenced_and_current_dictionaries(kind: str, tiny_model: CausalLM,
                                                      tmp_path: Path,
                                                      redis_server: RedisServer) -> None:
    store = _store(kind, tmp_path, redis_server, tiny_model)
    unused, used, current = (_dictionary("a", _tokens(30, seed)) for seed in (21, 22, 23))
    store.put_dictionary(unused, namespace="a")
    store.put_dictionary(used, namespace="a")
    store.put("s", QUOTING, level="portable+mix", namespace="a")
    store.put_dictionary(current, namespace="a")
    report = store.gc(namespace="a")
    assert report.dictionaries_removed == 1
    assert store.dictionaries(namespace="a") == sorted([used.digest, current.digest])
    assert _cold(store, tiny_model).get("s", namespace="a").tokens == QUOTING
    audit = store.audit(namespace="a")
    assert audit.consistent and audit.dictionaries == 2
    assert store.byte_counts(namespace="a").dictionaries == used.size_bytes + current.size_bytes
    store.delete("s", namespace="a")
    assert store.gc(namespace="a").dictionaries_removed == 1
    assert store.dictionaries(namespace="a") == [current.digest]
    assert store.gc(namespace="a").dictionaries_removed == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_commit_naming_a_dictionary_the_namespace_lacks_changes_nothing(
        kind: str, tmp_path: Path, redis_server: RedisServer) -> None:
    backend = _backend(kind, tmp_path, redis_server)
    ns = namespace_key(check_namespace("a"))
    record = bytes.fromhex("10") + bytes([1, 0, 0]) + b"payload"
    plan = CommitPlan(SessionName("s"), 3, None, record, None, (), "0" * 64)
    with pytest.raises(DictionaryGoneError):
        backend.commit(ns, plan)
    assert backend.names(ns) == []
    assert backend.audit(ns).spans == 0


@pytest.mark.parametrize("kind", KINDS)
def test_the_default_level_is_portable(kind: str, tiny_model: CausalLM, tmp_path: Path,
                                       redis_server: RedisServer) -> None:
    store = _store(kind, tmp_path, redis_server, tiny_model)
    tokens = [1, *_tokens(20, 31)]
    store.put("s", tokens, namespace="a")
    (found,) = store.backend.fetch_sessions(namespace_key(check_namespace("a")),
                                            [SessionName("s")])
    assert found is not None
    assert store.backend.codec(read_frame(found.chain[-1].record).codec).level == "portable"
    assert DEFAULT_STORE_LEVEL == "portable"
    assert ModelCodec(tiny_model).level.spec.name == "portable"
    assert _cold(store, tiny_model).get("s", namespace="a").tokens == tokens


def test_a_mixing_span_decodes_only_with_its_dictionary(tiny_model: CausalLM) -> None:
    codec = ModelCodec(tiny_model, "portable+mix")
    dictionary = _dictionary("a")

    def stored(mixed_with: Dictionary | None) -> SpanRecord:
        session = codec.encode(QUOTING, None, None, mixed_with).session
        return read_span(write_span(SpanRecord(
            1, None, 0, True, session.count, session.tokens_digest, session.kv_digest,
            session.dictionary, session.residual, session.token_code)))

    record = stored(dictionary)
    assert record.dictionary == str(dictionary.digest)
    (decoded,) = codec.decode_many([SpanItem(record, None, dictionary)])
    assert decoded.tokens == QUOTING
    with pytest.raises(DictionaryUnavailableError, match=str(dictionary.digest)[:16]):
        codec.decode_many([SpanItem(record, None, None)])
    without = stored(None)  # the level mixes with the session alone
    assert without.dictionary is None
    assert codec.decode_many([SpanItem(without, None)])[0].tokens == QUOTING

"""Issue 46, point 1: the store's index keyed by the one block hash, and the upgrade to schema 3
that drops the entries stores of schema 1 and 2 keyed by the earlier hash
(``seqkv.store.backends.base`` invariant 8), on both backends, from the committed store of
schema 1 (``tests/legacy_stores.py``).

The mutants: the Redis upgrade script without its deletion, and old entries fed back after the
upgrade, each leave entries the check below names.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from legacy_stores import STORE_V1, STORE_V1_TOKENS
from seqkv.store.backends import redis as redis_backend
from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.index import IndexSpacing, chain_keys
from test_store_unbound import KINDS, NS, Store, _legacy

P, Q = STORE_V1_TOKENS["p"], STORE_V1_TOKENS["q"]


def _old_entries() -> list[tuple[bytes, int]]:
    """The committed store's index entries (keyed by the hash before the block hash)."""
    db = sqlite3.connect(f"file:{STORE_V1 / 'tokens' / 'store.sqlite3'}?mode=ro", uri=True)
    try:
        return [(bytes(k), int(s)) for k, s in db.execute("SELECT key, span FROM idx")]
    finally:
        db.close()


def _entries(store: Store) -> dict[bytes, int]:
    """The namespace's index entries as they are stored: key -> span."""
    if store.kind == "directory":
        return {bytes(k): int(s) for k, s in store.sql("SELECT key, span FROM idx WHERE ns = ?",
                                                       NS)}
    out = {}
    for bucket in store.client.scan_iter(match=f"{store.prefix}:{NS.hex()}:i:*"):
        head = bytes.fromhex(bucket.decode().rsplit(":", 1)[1])
        for rest, span in store.client.hgetall(bucket).items():
            out[head + rest] = int(span)
    return out


def _feed(store: Store, entries: list[tuple[bytes, int]]) -> None:
    """Write ``entries`` into the index the way each backend lays it out."""
    for key, span in entries:
        if store.kind == "directory":
            store.sql("INSERT OR REPLACE INTO idx(ns, key, span) VALUES (?, ?, ?)", NS, key, span)
        else:
            store.client.hset(f"{store.prefix}:{NS.hex()}:i:{key[:2].hex()}", key[2:], span)


def _keys_of(*sessions: list[int]) -> set[bytes]:
    spacing = IndexSpacing()
    return {key for tokens in sessions for key in chain_keys(
        NS, tokens, spacing.positions(len(tokens)), spacing.key_bytes)}


def _stale(store: Store, *sessions: list[int]) -> set[bytes]:
    """Entries that are not keys of ``sessions`` under the block hash."""
    return set(_entries(store)) - _keys_of(*sessions)


def test_the_committed_store_holds_entries_of_the_old_keys() -> None:
    old = _old_entries()
    assert old and not {key for key, _ in old} & _keys_of(P, Q)


@pytest.mark.parametrize("kind", KINDS)
def test_the_upgrade_drops_the_old_entries_and_puts_index_with_the_new_keys(
        kind: str, tmp_path: Path, redis_server: RedisServer) -> None:
    store = _legacy(kind, tmp_path, redis_server)
    assert set(_entries(store)) == {key for key, _ in _old_entries()}
    session = store.open()
    assert _entries(store) == {}
    assert session.get("p", namespace="n").tokens == P
    assert session.get("q", namespace="n").tokens == Q
    r = [*P, 1, 2, 3]
    put = session.put("r", r, level="plain", namespace="n")
    assert put.shared_tokens == 0  # p's entries went with the old keys: coded again
    assert set(_entries(store)) == _keys_of(r) and not _stale(store, r)
    s = [*r, 9]
    assert session.put("s", s, level="plain", namespace="n").shared_tokens == len(r)
    assert [x.tokens for x in session.get_many(["p", "q", "r", "s"], namespace="n")] == [
        P, Q, r, s]
    assert not _stale(store, r, s)


@pytest.mark.parametrize("kind", KINDS)
def test_the_upgrade_from_schema_2_drops_them_too(kind: str, tmp_path: Path,
                                                 redis_server: RedisServer) -> None:
    store = _legacy(kind, tmp_path, redis_server)
    store.open().put("r", [*P, 1, 2, 3], level="plain", namespace="n")
    store.reset_schema("2")
    _feed(store, _old_entries())
    session = store.open()
    assert _entries(store) == {}
    assert session.get("r", namespace="n").tokens == [*P, 1, 2, 3]


@pytest.mark.parametrize("kind", KINDS)
def test_mutant_old_entries_fed_back_are_named(kind: str, tmp_path: Path,
                                               redis_server: RedisServer) -> None:
    """The defect the upgrade's deletion removes, fed after it: the check names every old entry
    (and the store still matches exactly: an old entry is a hint, never trusted)."""
    store = _legacy(kind, tmp_path, redis_server)
    session = store.open()
    _feed(store, _old_entries())
    assert _stale(store) == {key for key, _ in _old_entries()}
    put = session.put("r", [*P, 1, 2, 3], level="plain", namespace="n")
    assert put.shared_tokens == 0
    assert session.get("r", namespace="n").tokens == [*P, 1, 2, 3]


def test_mutant_redis_upgrade_without_the_deletion_keeps_the_old_entries(
        tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    deletion = "redis.call('DEL', key)"
    assert deletion in redis_backend._SCHEMA
    monkeypatch.setattr(redis_backend, "_SCHEMA", redis_backend._SCHEMA.replace(deletion, ""))
    store = _legacy("redis", tmp_path, redis_server)
    store.open()
    assert _stale(store) == {key for key, _ in _old_entries()}

"""Issue 44, point 1: a binding that damage cannot switch off, on both backends.

An attack campaign found that the unbound mark of a schema-1 row switched the row's binding off:
a row given the mark and a lowered length read as a shorter session with no error (four cases
on a directory, one in a chain; three on Redis), a row stripped of its binding under a schema
mark set back to 1 (or removed) was "upgraded" to unbound on the next open, ``audit --deep``
listed such rows as unbound, not damaged, and ``stat`` reported the damaged length.

Each case below is the campaign's edit, made the way it made it (SQL on the directory's
database, commands on Redis), and must end in a named ``SeqKVError``; a genuine store of schema 1
(``tests/legacy_stores.py``) must still open and read on both backends. Each guard has a mutant
test: with the guard monkeypatched away, the same case returns the wrong session, which is what
the case's assertion catches.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from legacy_stores import STORE_V1_TOKENS, directory_store_v1, redis_store_v1
from seqkv import cli
from seqkv.formats.span import SPAN_VERSION
from seqkv.models import CausalLM
from seqkv.store import (
    CorruptRecordError,
    SessionStore,
    StoreDamagedError,
    StoreSchemaMarkError,
    TokensCodec,
)
from seqkv.store import store as store_module
from seqkv.store.backends import base, directory
from seqkv.store.backends import redis as redis_backend
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.backends.redis import RedisBackend
from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.ids import check_namespace, namespace_key

KINDS = ["directory", "redis"]
NS = namespace_key(check_namespace("n"))
S1 = [3 + (5 * i) % 400 for i in range(20)]
S2 = [7 + (11 * i) % 400 for i in range(20)]
S3 = [*S2, *range(40, 50)]  # a chain: S2's span, then a span of its own
UNLISTED = "has no binding and is not a row the upgrade from schema 1 listed"


class Store:
    """One store of the tokens-only codec and the raw edits the campaign made on it."""

    def __init__(self, kind: str, root: Path, server: RedisServer,
                 prefix: str | None = None) -> None:
        self.kind = kind
        self.root = root
        self.url = server.url
        self.prefix = prefix or f"u{uuid.uuid4().hex[:10]}"
        self.client: Any = redis.Redis.from_url(server.url)

    def open(self) -> SessionStore:
        backend: DirectoryBackend | RedisBackend = (
            DirectoryBackend(self.root) if self.kind == "directory"
            else RedisBackend(self.url, self.prefix))
        return SessionStore(backend, lambda level: TokensCodec(512, level), hot_bytes=0)

    def sql(self, statement: str, *args: object) -> list[Any]:
        db = sqlite3.connect(self.root / "store.sqlite3", isolation_level=None)
        try:
            return db.execute(statement, args).fetchall()
        finally:
            db.close()

    @property
    def rows(self) -> str:
        return f"{self.prefix}:{NS.hex()}:n"

    def row(self, name: str) -> tuple[int, int]:
        if self.kind == "directory":
            ((span, length),) = self.sql("SELECT span, length FROM sessions WHERE name = ?",
                                         name)
            return span, length
        span, length = self.client.hget(self.rows, name).split(b":")[:2]
        return int(span), int(length)

    def unbind(self, name: str, span: int, length: int, mark: bool = True) -> None:
        """The row of ``name`` as (span, length) with the unbound mark (``mark``) or with no
        binding at all."""
        if self.kind == "directory":
            self.sql("INSERT OR REPLACE INTO sessions(ns, name, span, length, binding) VALUES "
                     "(?, ?, ?, ?, ?)", NS, name, span, length, b"" if mark else None)
        else:
            self.client.hset(self.rows, name, f"{span}:{length}{':-' if mark else ''}")

    def reset_schema(self, to: str | None) -> None:
        """The store's schema mark set to ``to``, or removed."""
        if self.kind == "directory":
            if to is None:
                self.sql("DELETE FROM meta WHERE k = 'schema'")
            else:
                self.sql("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", to)
        elif to is None:
            self.client.hdel(f"{self.prefix}:meta", "schema")
        else:
            self.client.hset(f"{self.prefix}:meta", "schema", to)

    def listed(self) -> dict[str, tuple[int, int]]:
        """The namespace's legacy list."""
        if self.kind == "directory":
            if not self.sql("SELECT 1 FROM sqlite_master WHERE name = 'legacy'"):
                return {}  # a store of schema 1, not opened yet
            return {name: (span, length) for name, span, length in self.sql(
                "SELECT name, span, length FROM legacy WHERE ns = ?", NS)}
        out = {}
        for name, value in self.client.hgetall(f"{self.prefix}:{NS.hex()}:l").items():
            span, length = value.split(b":")
            out[name.decode()] = (int(span), int(length))
        return out


@pytest.fixture(params=KINDS)
def filled(request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer) -> Store:
    """A store of schema 3 holding s1, s2 and s3 (s3 extends s2) in namespace "n"."""
    store = Store(request.param, tmp_path / "store", redis_server)
    session = store.open()
    for name, tokens in (("s1", S1), ("s2", S2), ("s3", S3)):
        session.put(name, tokens, level="ngram", namespace="n")
    session.close()
    return store


def _lowered(store: Store, name: str = "s2") -> None:
    """The campaign's edit: the unbound mark and the length lowered by 5, the span kept."""
    span, length = store.row(name)
    store.unbind(name, span, length - 5)


def _pointed_at_prefix(store: Store) -> None:
    """The campaign's chain case: s3's row unbound and pointed at its prefix's span (s2's)."""
    store.unbind("s3", *store.row("s2"))


def _stripped_and_reset(to: str | None) -> Callable[[Store], None]:
    def damage(store: Store) -> None:
        span, length = store.row("s2")
        store.unbind("s2", span, length - 5, mark=False)
        store.reset_schema(to)

    return damage


ROW_ATTACKS = {"length lowered by 5": ("s2", _lowered),
               "pointed at its prefix's span": ("s3", _pointed_at_prefix)}
RESET_ATTACKS = {"mark set to 1": _stripped_and_reset("1"),
                 "mark removed": _stripped_and_reset(None)}


@pytest.mark.parametrize("attack", ROW_ATTACKS)
def test_an_unbound_mark_on_a_bound_row_is_refused(filled: Store, attack: str) -> None:
    name, damage = ROW_ATTACKS[attack]
    damage(filled)
    store = filled.open()
    with pytest.raises(CorruptRecordError, match=f"session '{name}'.*{UNLISTED}"):
        store.get(name, namespace="n")
    with pytest.raises(CorruptRecordError, match=UNLISTED):
        store.get_many(["s1", name], namespace="n")
    with pytest.raises(CorruptRecordError, match=UNLISTED):
        store.stat(name, namespace="n")
    with pytest.raises(CorruptRecordError, match=UNLISTED):
        store.append(name, [1, 2], namespace="n")
    assert store.get("s1", namespace="n").tokens == S1


@pytest.mark.parametrize("attack", ROW_ATTACKS)
def test_the_audits_name_an_unlisted_unbound_row_damaged(filled: Store, attack: str) -> None:
    """The recount counts the row malformed (so gc refuses), the deep audit names it damaged
    and lists nothing unbound."""
    name, damage = ROW_ATTACKS[attack]
    damage(filled)
    store = filled.open()
    report = store.audit(namespace="n")
    assert (report.malformed, report.unbound, report.consistent) == (1, 0, False)
    deep = store.audit_deep(namespace="n")
    assert [(d.session, d.error) for d in deep.damaged] == [(name, "CorruptRecordError")]
    assert UNLISTED in deep.damaged[0].message
    assert deep.unbound == () and not deep.consistent
    with pytest.raises(StoreDamagedError, match="malformed"):
        store.gc(namespace="n")


@pytest.mark.parametrize("attack", RESET_ATTACKS)
def test_a_schema_mark_reset_over_later_rows_is_refused(filled: Store, attack: str) -> None:
    """Stripping a row's binding and setting the schema mark back to 1 (or removing it) no
    longer upgrades the row to unbound: the store holds bound rows and records of the current
    span version, so it is refused by name, and nothing is written."""
    RESET_ATTACKS[attack](filled)
    with pytest.raises(StoreSchemaMarkError, match=r"marked schema 1 \(or not marked\) but "
                                                   r"holds session rows with a binding or the "
                                                   r"unbound mark: 2, span records of version "
                                                   f"{SPAN_VERSION}, which only"):
        filled.open()
    assert filled.listed() == {}
    filled.reset_schema("3")
    with pytest.raises(CorruptRecordError, match="no mark of a row of schema 1"):
        filled.open().get("s2", namespace="n")


@pytest.mark.parametrize("kind", KINDS)
def test_a_mark_reset_over_a_store_of_unbound_rows_is_refused(
        kind: str, tmp_path: Path, redis_server: RedisServer) -> None:
    """A store whose rows are all legacy rows holds no binding, but it holds the legacy list
    (and p's unbound mark, q's stripped): refused."""
    store = _legacy(kind, tmp_path, redis_server)
    store.open().get("p", namespace="n")
    span, length = store.row("q")
    store.unbind("q", span, length - 5, mark=False)
    store.reset_schema("1")
    with pytest.raises(StoreSchemaMarkError, match="holds session rows with a binding or the "
                                                   "unbound mark: 1, rows on a legacy list: 2, "
                                                   "which only"):
        store.open()


@pytest.mark.parametrize("kind", KINDS)
def test_cli_audit_deep_and_stat_name_the_row(kind: str, tmp_path: Path,
                                              redis_server: RedisServer, use_tiny: CausalLM,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``store audit --deep`` lists the row damaged, not unbound; ``store stat`` refuses it in
    one line. (The CLI opens Redis under the default prefix: this module's server is its
    own.)"""
    store = Store(kind, tmp_path / "store", redis_server, prefix="skv")
    for key in store.client.scan_iter(match="skv:*"):
        store.client.delete(key)
    session = store.open()
    session.put("s2", S2, level="ngram", namespace="n")
    _lowered(store)
    location = f"dir:{store.root}" if kind == "directory" else store.url
    options = ["--store", location, "--namespace", "n", "--json"]
    status = cli.main(["store", "audit", "--deep", *options])
    out = capsys.readouterr().out
    assert status == 1 and '"session": "s2"' in out and '"unbound": []' in out
    status = cli.main(["store", "stat", "s2", *options])
    err = capsys.readouterr().err
    assert status != 0 and UNLISTED in err and err.count("\n") == 1


def _legacy(kind: str, tmp_path: Path, server: RedisServer) -> Store:
    """The committed store of schema 1 (its tokens-only part: p, and q extending p), not yet
    opened by this seqkv."""
    if kind == "directory":
        return Store(kind, directory_store_v1(tmp_path, "tokens"), server)
    store = Store(kind, tmp_path, server, prefix=f"v1{uuid.uuid4().hex[:10]}")
    redis_store_v1(store.client, store.prefix, "tokens")
    return store


@pytest.mark.parametrize("kind", KINDS)
def test_a_genuine_schema_1_store_opens_reads_and_lists_its_rows(
        kind: str, tmp_path: Path, redis_server: RedisServer) -> None:
    store = _legacy(kind, tmp_path, redis_server)
    assert store.listed() == {}
    session = store.open()
    assert [s.tokens for s in session.get_many(["p", "q"], namespace="n")] == [
        STORE_V1_TOKENS["p"], STORE_V1_TOKENS["q"]]
    assert store.listed() == {"p": (1, 40), "q": (2, 23)}
    report = session.audit(namespace="n")
    assert (report.unbound, report.malformed, report.consistent) == (2, 0, True)
    stat = session.stat("q", namespace="n")
    assert (stat.tokens, stat.binding_checked) == (23, False)
    reopened = store.open()
    assert reopened.audit_deep(namespace="n").unbound == ("p", "q")
    assert reopened.get("q", namespace="n").tokens == STORE_V1_TOKENS["q"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_listed_row_damaged_after_the_upgrade_is_refused(
        kind: str, tmp_path: Path, redis_server: RedisServer) -> None:
    store = _legacy(kind, tmp_path, redis_server)
    store.open()
    span, length = store.row("q")
    store.unbind("q", span, length - 5)
    with pytest.raises(CorruptRecordError, match=rf"span {span}, length {length - 5}\).*"
                                                 rf"{UNLISTED} as it is"):
        store.open().get("q", namespace="n")
    store.unbind("q", *store.row("p"))
    with pytest.raises(CorruptRecordError, match=UNLISTED):
        store.open().get("q", namespace="n")


@pytest.mark.parametrize("kind", KINDS)
def test_a_rewritten_legacy_row_leaves_the_list(kind: str, tmp_path: Path,
                                                redis_server: RedisServer) -> None:
    """An append binds q and drops it from the list in the same step, so q's old row restored
    with the mark (a rollback to what q was) is refused; a delete drops p's entry, so p's row
    written back (its span lives on as q's prefix) is refused."""
    store = _legacy(kind, tmp_path, redis_server)
    session = store.open()
    old = store.row("q")
    session.append("q", [1, 2, 3], namespace="n")
    assert store.listed() == {"p": (1, 40)}
    store.unbind("q", *old)
    with pytest.raises(CorruptRecordError, match=UNLISTED):
        store.open().get("q", namespace="n")
    old = store.row("p")
    session.delete("p", namespace="n")
    assert store.listed() == {}
    store.unbind("p", *old)
    with pytest.raises(CorruptRecordError, match=UNLISTED):
        store.open().get("p", namespace="n")


def _as_schema_2(store: Store) -> None:
    """What an upgrade by the seqkv of schema 2 left: the marks, no list, schema 2."""
    if store.kind == "directory":
        store.sql("DELETE FROM legacy")
    else:
        store.client.delete(f"{store.prefix}:{NS.hex()}:l")
    store.reset_schema("2")


@pytest.mark.parametrize("kind", KINDS)
def test_a_schema_2_store_lists_only_rows_naming_version_1_records(
        kind: str, tmp_path: Path, redis_server: RedisServer) -> None:
    """The upgrade from 2 lists p and q (their records are of version 1); r, put since and
    stripped to the mark over a lowered length, names a version-2 record, cannot be a row of
    schema 1, and is refused."""
    store = _legacy(kind, tmp_path, redis_server)
    store.open().put("r", [*STORE_V1_TOKENS["q"], 5, 6, 7], level="plain", namespace="n")
    _as_schema_2(store)
    span, length = store.row("r")
    store.unbind("r", span, length - 2)
    session = store.open()
    assert store.listed() == {"p": (1, 40), "q": (2, 23)}
    assert session.get("q", namespace="n").tokens == STORE_V1_TOKENS["q"]
    with pytest.raises(CorruptRecordError, match=f"session 'r'.*{UNLISTED}"):
        session.get("r", namespace="n")
    assert [d.session for d in session.audit_deep(namespace="n").damaged] == ["r"]


# Mutants: each guard taken away makes its case return the wrong session.


@pytest.mark.parametrize("attack", ROW_ATTACKS)
def test_mutant_without_the_list_check_reads_the_wrong_session(
        filled: Store, attack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, damage = ROW_ATTACKS[attack]
    want = S2 if name == "s2" else S3
    damage(filled)
    monkeypatch.setattr(base, "is_listed", lambda entry, legacy: True)
    got = filled.open().get(name, namespace="n").tokens
    assert got != want and got == want[: len(got)]
    assert filled.open().stat(name, namespace="n").tokens == len(got)
    if filled.kind == "directory":  # Redis' recount has its own guard (the next mutant)
        assert filled.open().audit(namespace="n").malformed == 0


def _mutate(monkeypatch: pytest.MonkeyPatch, script: str, guard: str, without: str) -> None:
    """The Redis backend's ``script`` with ``guard`` replaced by ``without`` (for backends
    opened after this call)."""
    source = getattr(redis_backend, script)
    assert guard in source, f"{script} no longer holds the guard this mutant removes"
    monkeypatch.setattr(redis_backend, script, source.replace(guard, without))


_AUDIT_GUARD = ("local legacy = binding == ':-' and\n"
                "      redis.call('HGET', p .. ':l', sessions[i - 1]) == span .. ':' .. length")


def test_mutant_redis_audit_without_the_list_check_counts_the_row_unbound(
        tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    filled = Store("redis", tmp_path, redis_server)
    filled.open().put("s2", S2, level="ngram", namespace="n")
    _lowered(filled)
    _mutate(monkeypatch, "_AUDIT", _AUDIT_GUARD, "local legacy = binding == ':-'")
    report = filled.open().audit(namespace="n")
    assert (report.malformed, report.unbound) == (0, 1)


_REFUSAL_GUARD = "if marked > 0 or lists > 0 or newest > 1 then"


@pytest.mark.parametrize("attack", RESET_ATTACKS)
def test_mutant_without_the_schema_refusal_upgrades_the_damaged_row(
        filled: Store, attack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    RESET_ATTACKS[attack](filled)
    if filled.kind == "directory":
        monkeypatch.setattr(directory, "refuse_schema_1", lambda evidence, where: None)
    else:
        _mutate(monkeypatch, "_SCHEMA", _REFUSAL_GUARD, "if false then")
    assert filled.open().get("s2", namespace="n").tokens == S2[:15]


@pytest.mark.parametrize("kind", KINDS)
def test_mutant_whose_commit_keeps_the_entry_reads_the_rolled_back_row(
        kind: str, tmp_path: Path, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if kind == "directory":
        monkeypatch.setattr(directory, "_FORGET_LEGACY", "SELECT ?, ?")
    else:
        _mutate(monkeypatch, "_COMMIT", "redis.call('HDEL', p .. ':l', name)", "")
    store = _legacy(kind, tmp_path, redis_server)
    session = store.open()
    old = store.row("p")
    session.append("p", [1, 2, 3], namespace="n")
    store.unbind("p", *old)
    assert store.open().get("p", namespace="n").tokens == STORE_V1_TOKENS["p"]


@pytest.mark.parametrize("kind", KINDS)
def test_mutant_whose_delete_keeps_the_entry_brings_the_session_back(
        kind: str, tmp_path: Path, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if kind == "directory":
        monkeypatch.setattr(directory, "_FORGET_LEGACY", "SELECT ?, ?")
    else:
        _mutate(monkeypatch, "_DELETE", "redis.call('HDEL', p .. ':l', name)", "")
    store = _legacy(kind, tmp_path, redis_server)
    session = store.open()
    old = store.row("p")
    session.delete("p", namespace="n")  # q's span keeps p's alive
    store.unbind("p", *old)
    assert store.open().get("p", namespace="n").tokens == STORE_V1_TOKENS["p"]


@pytest.mark.parametrize("kind", KINDS)
def test_mutant_listing_every_unbound_row_of_schema_2_reads_the_damaged_row(
        kind: str, tmp_path: Path, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = _legacy(kind, tmp_path, redis_server)
    extended = [*STORE_V1_TOKENS["q"], 5, 6, 7]
    store.open().put("r", extended, level="plain", namespace="n")
    _as_schema_2(store)
    span, length = store.row("r")
    store.unbind("r", span, length - 2)
    if kind == "directory":
        monkeypatch.setattr(DirectoryBackend, "_record_version", lambda self, span: 1)
    else:
        _mutate(monkeypatch, "_SCHEMA", "if span and record_version(ns .. ':s:' .. span) == 1",
                "if span")
    assert store.open().get("r", namespace="n").tokens == extended[:-2]


def test_stat_checks_the_length_and_the_binding_it_can(filled: Store,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound row's length raised past its span, or a row copied from another session (it
    ends at that session's last token, so its binding is compared over the record's tokens
    digest): stat refuses both; each guard taken away, stat reports the damaged row."""
    store = filled.open()
    assert store.stat("s3", namespace="n").binding_checked
    length = filled.row("s1")[1]
    if filled.kind == "directory":
        filled.sql("UPDATE sessions SET length = ? WHERE name = 's1'", length + 5)
    else:
        row = filled.client.hget(filled.rows, "s1").split(b":")
        filled.client.hset(filled.rows, "s1", b":".join([row[0], b"%d" % (length + 5), row[2]]))
    with pytest.raises(CorruptRecordError, match="claims 25 tokens of span"):
        store.stat("s1", namespace="n")
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "_check_length", lambda *args: None)
        assert store.stat("s1", namespace="n").tokens == length + 5
    if filled.kind == "directory":
        filled.sql("UPDATE sessions SET span = (SELECT span FROM sessions WHERE name = 's2'), "
                   "length = 20, binding = (SELECT binding FROM sessions WHERE name = 's2') "
                   "WHERE name = 's1'")
    else:
        filled.client.hset(filled.rows, "s1", filled.client.hget(filled.rows, "s2"))
    with pytest.raises(CorruptRecordError, match=r"session 's1'.*fails its binding"):
        store.stat("s1", namespace="n")
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "_check_binding", lambda *args: None)
        assert store.stat("s1", namespace="n").binding_checked
    lowered = filled.row("s3")
    if filled.kind == "directory":
        filled.sql("UPDATE sessions SET length = ? WHERE name = 's3'", lowered[1] - 5)
    else:
        row = filled.client.hget(filled.rows, "s3").split(b":")
        filled.client.hset(filled.rows, "s3", b":".join([row[0], b"%d" % (lowered[1] - 5),
                                                         row[2]]))
    # inside its span: the binding needs the decoded tokens, and stat says it did not check it
    assert not store.stat("s3", namespace="n").binding_checked
    with pytest.raises(CorruptRecordError, match="fails its binding"):
        store.get("s3", namespace="n")

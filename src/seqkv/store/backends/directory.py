"""The directory backend: span records as files, everything else in one SQLite database.

Layout of the store directory::

    store.sqlite3          sessions, span reference counts, the prefix index, codec identities,
                           mixing dictionaries (bytes per namespace and digest, the current one,
                           and which span was coded with which)
    records/<hh>/<id>      one file per span record (``seqkv.store.record``), <hh> = id mod 256

Motivation: records are immutable blobs, written once with the classic atomic-file protocol; the
metadata must change atomically across several rows (a session entry, two or three counts,
index entries), which is what SQLite's journal is made for, with no server. Several processes
may share one directory: SQLite's file lock serializes writers.

A commit runs inside one ``BEGIN IMMEDIATE`` transaction (the database write lock): check the
session and the parent, insert the span row (its id comes from AUTOINCREMENT), write the record
file (temporary file, fsync, rename, fsync of the directory), then the counts, index entries and
session entry, then COMMIT (``synchronous=FULL``: on disk before it returns).

Invariants:
1. After ``kill -9`` at any point, every acknowledged put decodes: its rows were committed after
   its file was renamed and fsynced (enforced by the order above; fault-tested).
2. Nothing half-written is visible: a reader sees a span row only after COMMIT, and the file it
   names was complete before (enforced). A crash can leave a record file without a row, or a
   temporary file; ``gc`` removes them under the write lock, when no writer can be between its
   rename and its COMMIT (enforced).
3. AUTOINCREMENT never reuses an id, even after deletes (enforced by SQLite), so record files and
   cached decoded spans can never be confused.
4. A dictionary's bytes, its being current, and a span's reference to it change inside the same
   transactions as the spans (enforced), so ``seqkv.store.backends.base`` invariant 5 holds across
   crashes. Dictionaries live in the database, not in files: they are written once per
   namespace and digest, and a row needs no orphan sweep.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from seqkv.store.backends.base import (
    AuditReport,
    ByteCounts,
    CodecIdentity,
    CommitPlan,
    DictionaryGoneError,
    GcReport,
    IdentityCache,
    ParentGoneError,
    SessionChain,
    SessionEntry,
    StoredSpan,
)
from seqkv.store.errors import (
    ConcurrentUpdateError,
    CorruptRecordError,
    SessionExistsError,
    StoreUnavailableError,
)
from seqkv.store.ids import NamespaceKey, SessionName, SpanId

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS codecs(idx INTEGER PRIMARY KEY AUTOINCREMENT,
    digest TEXT UNIQUE NOT NULL, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS spans(id INTEGER PRIMARY KEY AUTOINCREMENT, ns BLOB NOT NULL,
    parent INTEGER, refcount INTEGER NOT NULL, nbytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions(ns BLOB NOT NULL, name TEXT NOT NULL, span INTEGER NOT NULL,
    length INTEGER NOT NULL, PRIMARY KEY(ns, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idx(ns BLOB NOT NULL, key BLOB NOT NULL, span INTEGER NOT NULL,
    PRIMARY KEY(ns, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dicts(ns BLOB NOT NULL, digest TEXT NOT NULL, data BLOB NOT NULL,
    UNIQUE(ns, digest));
CREATE TABLE IF NOT EXISTS dict_current(ns BLOB PRIMARY KEY, digest TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS span_dicts(span INTEGER PRIMARY KEY, ns BLOB NOT NULL,
    digest TEXT NOT NULL);
"""
_CHAIN = """
WITH RECURSIVE chain(id, parent, depth) AS (
    SELECT id, parent, 0 FROM spans WHERE id = ? AND ns = ?
    UNION ALL SELECT s.id, s.parent, c.depth + 1 FROM spans s JOIN chain c ON s.id = c.parent)
SELECT id FROM chain ORDER BY depth DESC
"""
_BUSY_MS = 60_000


def _fsync_dir(path: Path) -> None:
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Temporary file beside ``path``, fsync, rename over ``path``, fsync the directory."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


class DirectoryBackend:
    """``StoreBackend`` in a local directory (created if missing)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root)
        try:
            (self._root / "records").mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreUnavailableError(f"cannot create the store at {self._root}: {error}"
                                        ) from error
        self._local = threading.local()
        self._trips = 0
        self._cache = IdentityCache()
        self._connection()

    @property
    def root(self) -> Path:
        return self._root

    @property
    def round_trips(self) -> int:
        return self._trips

    def _connection(self) -> sqlite3.Connection:
        # NOTE: a SQLite connection must not cross fork() or threads (Ray runs an actor's
        # constructor and its calls on different threads): one per process and thread.
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            try:
                db = sqlite3.connect(self._root / "store.sqlite3", timeout=_BUSY_MS / 1000,
                                     isolation_level=None)
                db.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
            except sqlite3.Error as error:
                raise StoreUnavailableError(f"cannot open the store at {self._root}: {error}"
                                            ) from error
            self._local.db, self._local.pid = db, os.getpid()
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._connection()
        self._trips += 1
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        db = self._connection()
        self._trips += 1
        db.execute("BEGIN")
        try:
            yield db
        finally:
            db.execute("COMMIT")

    def _path(self, span: int) -> Path:
        return self._root / "records" / f"{span % 256:02x}" / f"{span:x}"

    def store_id(self) -> str:
        return self._cache.store_id(self._fetch_store_id)

    def _fetch_store_id(self) -> str:
        with self._write() as db:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('id', ?)", (secrets.token_hex(16),))
            return str(db.execute("SELECT v FROM meta WHERE k = 'id'").fetchone()[0])

    def register_codec(self, identity: CodecIdentity) -> int:
        return self._cache.register(identity, self._add_codec)

    def _add_codec(self, identity: CodecIdentity) -> int:
        with self._write() as db:
            db.execute("INSERT OR IGNORE INTO codecs(digest, description) VALUES (?, ?)",
                       (identity.digest, identity.description))
            return int(db.execute("SELECT idx FROM codecs WHERE digest = ?",
                                  (identity.digest,)).fetchone()[0])

    def codec(self, index: int) -> CodecIdentity:
        return self._cache.codec(index, self._fetch_codec)

    def _fetch_codec(self, index: int) -> str | None:
        with self._read() as db:
            row = db.execute("SELECT description FROM codecs WHERE idx = ?", (index,)).fetchone()
        return None if row is None else str(row[0])

    def lookup(self, ns: NamespaceKey, keys: Sequence[bytes]) -> list[SpanId | None]:
        if not keys:
            return []
        with self._read() as db:
            marks = ",".join("?" * len(keys))
            found = dict(db.execute(f"SELECT key, span FROM idx WHERE ns = ? AND key IN ({marks})",
                                    (ns, *keys)).fetchall())
        return [None if key not in found else SpanId(int(found[key])) for key in keys]

    def _records(self, spans: Sequence[int]) -> list[bytes] | None:
        out = []
        for span in spans:
            try:
                out.append(self._path(span).read_bytes())
            except FileNotFoundError:
                return None  # deleted by a concurrent release after our read
        return out

    def fetch_chain(self, ns: NamespaceKey, span: SpanId) -> tuple[StoredSpan, ...] | None:
        with self._read() as db:
            ids = [int(row[0]) for row in db.execute(_CHAIN, (span, ns)).fetchall()]
        if not ids or ids[-1] != span:
            return None
        records = self._records(ids)
        if records is None:
            return None
        return tuple(StoredSpan(SpanId(i), r) for i, r in zip(ids, records, strict=True))

    def fetch_sessions(self, ns: NamespaceKey, names: Sequence[SessionName]
                       ) -> list[SessionChain | None]:
        for _ in range(3):
            out: list[SessionChain | None] = []
            with self._read() as db:
                chains: list[tuple[SessionEntry, list[int]] | None] = []
                for name in names:
                    row = db.execute("SELECT span, length FROM sessions WHERE ns = ? AND name = ?",
                                     (ns, name)).fetchone()
                    if row is None:
                        chains.append(None)
                        continue
                    ids = [int(r[0]) for r in db.execute(_CHAIN, (row[0], ns)).fetchall()]
                    chains.append((SessionEntry(SpanId(int(row[0])), int(row[1])), ids))
            complete = True
            for item in chains:
                if item is None:
                    out.append(None)
                    continue
                records = self._records(item[1])
                if records is None:
                    complete = False
                    break
                out.append(SessionChain(item[0], tuple(
                    StoredSpan(SpanId(i), r) for i, r in zip(item[1], records, strict=True))))
            if complete:
                return out
        raise CorruptRecordError("a session's span records keep disappearing while read")

    def refcounts(self, ns: NamespaceKey, spans: Sequence[SpanId]) -> list[int]:
        with self._read() as db:
            marks = ",".join("?" * len(spans))
            found = dict(db.execute(
                f"SELECT id, refcount FROM spans WHERE ns = ? AND id IN ({marks})",
                (ns, *spans)).fetchall())
        return [int(found.get(span, 0)) for span in spans]

    def _release(self, db: sqlite3.Connection, span: int | None, removed: list[int]) -> None:
        while span is not None:
            db.execute("UPDATE spans SET refcount = refcount - 1 WHERE id = ?", (span,))
            count, parent = db.execute("SELECT refcount, parent FROM spans WHERE id = ?",
                                       (span,)).fetchone()
            if count > 0:
                return
            db.execute("DELETE FROM spans WHERE id = ?", (span,))
            db.execute("DELETE FROM span_dicts WHERE span = ?", (span,))
            removed.append(span)
            span = parent

    def _unlink(self, spans: Sequence[int]) -> None:
        for span in spans:
            self._path(span).unlink(missing_ok=True)

    def commit(self, ns: NamespaceKey, plan: CommitPlan) -> SpanId:
        removed: list[int] = []
        with self._write() as db:
            row = db.execute("SELECT span, length FROM sessions WHERE ns = ? AND name = ?",
                             (ns, plan.session)).fetchone()
            current = None if row is None else SessionEntry(SpanId(int(row[0])), int(row[1]))
            if plan.expect is None and current is not None:
                raise SessionExistsError(plan.session)
            if plan.expect is not None and current != plan.expect:
                raise ConcurrentUpdateError(plan.session)
            if plan.parent is not None and db.execute(
                    "SELECT 1 FROM spans WHERE id = ? AND ns = ?",
                    (plan.parent, ns)).fetchone() is None:
                raise ParentGoneError(plan.parent)
            if plan.record is not None and plan.dictionary is not None and db.execute(
                    "SELECT 1 FROM dicts WHERE ns = ? AND digest = ?",
                    (ns, plan.dictionary)).fetchone() is None:
                raise DictionaryGoneError(plan.dictionary)
            span = plan.parent
            if plan.record is not None:
                cursor = db.execute(
                    "INSERT INTO spans(ns, parent, refcount, nbytes) VALUES (?, ?, 0, ?)",
                    (ns, plan.parent, len(plan.record)))
                span = SpanId(int(cursor.lastrowid or 0))
                if plan.dictionary is not None:
                    db.execute("INSERT INTO span_dicts VALUES (?, ?, ?)",
                               (span, ns, plan.dictionary))
                path = self._path(span)
                path.parent.mkdir(exist_ok=True)
                write_file_atomically(path, plan.record)
                if plan.parent is not None:
                    db.execute("UPDATE spans SET refcount = refcount + 1 WHERE id = ?",
                               (plan.parent,))
                db.executemany(
                    "INSERT INTO idx(ns, key, span) VALUES (?, ?, ?) ON CONFLICT(ns, key) DO "
                    "UPDATE SET span = excluded.span WHERE idx.span NOT IN (SELECT id FROM spans)",
                    [(ns, key, span) for key in plan.index_keys])
            assert span is not None
            db.execute("UPDATE spans SET refcount = refcount + 1 WHERE id = ?", (span,))
            db.execute("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?)",
                       (ns, plan.session, span, plan.length))
            if current is not None:
                self._release(db, current.span, removed)
        self._unlink(removed)
        return span

    def delete(self, ns: NamespaceKey, name: SessionName) -> bool:
        removed: list[int] = []
        with self._write() as db:
            row = db.execute("SELECT span FROM sessions WHERE ns = ? AND name = ?",
                             (ns, name)).fetchone()
            if row is None:
                return False
            db.execute("DELETE FROM sessions WHERE ns = ? AND name = ?", (ns, name))
            self._release(db, int(row[0]), removed)
        self._unlink(removed)
        return True

    def names(self, ns: NamespaceKey) -> list[SessionName]:
        with self._read() as db:
            rows = db.execute("SELECT name FROM sessions WHERE ns = ? ORDER BY name",
                              (ns,)).fetchall()
        return [SessionName(str(r[0])) for r in rows]

    def _files(self) -> Iterator[Path]:
        for folder in (self._root / "records").iterdir():
            if folder.is_dir():
                yield from folder.iterdir()

    def _survey(self, db: sqlite3.Connection, ns: NamespaceKey
                ) -> tuple[dict[int, tuple[int | None, int]], dict[int, int], set[int], int]:
        spans = {int(i): (None if p is None else int(p), int(c)) for i, p, c in db.execute(
            "SELECT id, parent, refcount FROM spans WHERE ns = ?", (ns,))}
        counts: dict[int, int] = {}
        reachable: set[int] = set()
        sessions = 0
        for (span,) in db.execute("SELECT span FROM sessions WHERE ns = ?", (ns,)):
            sessions += 1
            counts[span] = counts.get(span, 0) + 1
            walk: int | None = int(span)
            while walk is not None and walk in spans and walk not in reachable:
                reachable.add(walk)
                parent = spans[walk][0]
                if parent is not None:
                    counts[parent] = counts.get(parent, 0) + 1
                walk = parent
        return spans, counts, reachable, sessions

    def _orphan_files(self, db: sqlite3.Connection) -> list[Path]:
        known = {int(r[0]) for r in db.execute("SELECT id FROM spans")}
        orphans = []
        for path in self._files():
            if path.name.startswith("."):
                orphans.append(path)
                continue
            try:
                span = int(path.name, 16)
            except ValueError:
                continue
            if span not in known:
                orphans.append(path)
        return orphans

    def audit(self, ns: NamespaceKey) -> AuditReport:
        with self._read() as db:
            spans, counts, _, sessions = self._survey(db, ns)
            mismatches = sum(1 for s, (_, c) in spans.items() if counts.get(s, 0) != c)
            missing = sum(1 for s in spans if not self._path(s).is_file())
            orphans = len(self._orphan_files(db))
            entries = db.execute("SELECT count(*) FROM idx WHERE ns = ?", (ns,)).fetchone()[0]
            dangling = db.execute("SELECT count(*) FROM idx WHERE ns = ? AND span NOT IN "
                                  "(SELECT id FROM spans)", (ns,)).fetchone()[0]
            dictionaries = db.execute("SELECT count(*) FROM dicts WHERE ns = ?",
                                      (ns,)).fetchone()[0]
            named = {(int(span), str(d)) for span, d in db.execute(
                "SELECT span, digest FROM span_dicts WHERE ns = ?", (ns,))}
            stored = {str(d) for (d,) in db.execute("SELECT digest FROM dicts WHERE ns = ?",
                                                   (ns,))}
        missing_dictionaries = sum(1 for span, d in named if span in spans and d not in stored)
        return AuditReport(sessions, len(spans), mismatches, missing, orphans, int(dangling),
                           int(entries), int(dictionaries), missing_dictionaries)

    def gc(self, ns: NamespaceKey) -> GcReport:
        with self._write() as db:
            orphans = self._orphan_files(db)
            for path in orphans:
                path.unlink(missing_ok=True)
            spans, counts, reachable, _ = self._survey(db, ns)
            dead = [s for s in spans if s not in reachable]
            db.executemany("DELETE FROM spans WHERE id = ?", [(s,) for s in dead])
            fixed = [(counts.get(s, 0), s) for s in reachable if counts.get(s, 0) != spans[s][1]]
            db.executemany("UPDATE spans SET refcount = ? WHERE id = ?", fixed)
            cursor = db.execute("DELETE FROM idx WHERE ns = ? AND span NOT IN "
                                "(SELECT id FROM spans)", (ns,))
            dangling = cursor.rowcount
            db.execute("DELETE FROM span_dicts WHERE ns = ? AND span NOT IN "
                       "(SELECT id FROM spans)", (ns,))
            cursor = db.execute(
                "DELETE FROM dicts WHERE ns = ? AND digest NOT IN "
                "(SELECT digest FROM span_dicts WHERE ns = ?) AND digest NOT IN "
                "(SELECT digest FROM dict_current WHERE ns = ?)", (ns, ns, ns))
            dictionaries = cursor.rowcount
        self._unlink(dead)
        return GcReport(len(orphans), dangling, len(fixed), len(dead), dictionaries)

    def byte_counts(self, ns: NamespaceKey) -> ByteCounts:
        with self._read() as db:
            records, spans = db.execute("SELECT coalesce(sum(nbytes), 0), count(*) FROM spans "
                                        "WHERE ns = ?", (ns,)).fetchone()
            index, entries = db.execute(
                "SELECT coalesce(sum(length(key) + length(CAST(span AS TEXT))), 0), count(*) "
                "FROM idx WHERE ns = ?", (ns,)).fetchone()
            sessions, ids = db.execute(
                "SELECT coalesce(sum(length(name) + length(CAST(span AS TEXT)) + "
                "length(CAST(length AS TEXT)) + 1), 0), coalesce(sum(length(name)), 0) "
                "FROM sessions WHERE ns = ?", (ns,)).fetchone()
            counts = db.execute("SELECT coalesce(sum(length(CAST(id AS TEXT)) + "
                                "length(CAST(refcount AS TEXT))), 0) FROM spans WHERE ns = ?",
                                (ns,)).fetchone()[0]
            dictionaries = db.execute("SELECT coalesce(sum(length(data)), 0) FROM dicts "
                                      "WHERE ns = ?", (ns,)).fetchone()[0]
        on_disk = sum(p.stat().st_blocks * 512 for p in self._files())
        on_disk += sum(p.stat().st_blocks * 512 for p in self._root.glob("store.sqlite3*"))
        return ByteCounts(int(records), int(spans), int(index), int(entries), int(sessions),
                          int(ids), int(counts), on_disk, int(dictionaries))

    def put_dictionary(self, ns: NamespaceKey, digest: str, data: bytes) -> bool:
        with self._write() as db:
            cursor = db.execute("INSERT OR IGNORE INTO dicts(ns, digest, data) VALUES (?, ?, ?)",
                                (ns, digest, data))
            db.execute("INSERT OR REPLACE INTO dict_current VALUES (?, ?)", (ns, digest))
        return cursor.rowcount == 1

    def current_dictionary(self, ns: NamespaceKey) -> str | None:
        with self._read() as db:
            row = db.execute("SELECT digest FROM dict_current WHERE ns = ?", (ns,)).fetchone()
        return None if row is None else str(row[0])

    def fetch_dictionary(self, ns: NamespaceKey, digest: str) -> bytes | None:
        with self._read() as db:
            row = db.execute("SELECT data FROM dicts WHERE ns = ? AND digest = ?",
                             (ns, digest)).fetchone()
        return None if row is None else bytes(row[0])

    def dictionary_digests(self, ns: NamespaceKey) -> list[str]:
        with self._read() as db:
            rows = db.execute("SELECT digest FROM dicts WHERE ns = ? ORDER BY digest",
                              (ns,)).fetchall()
        return [str(row[0]) for row in rows]

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        db = getattr(self._local, "db", None)
        if db is not None and getattr(self._local, "pid", None) == os.getpid():
            db.close()
        self._local.db = None

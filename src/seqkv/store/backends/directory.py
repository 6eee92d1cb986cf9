"""The directory backend: span records as files, everything else in one SQLite database.

Layout of the store directory::

    store.sqlite3          sessions, span reference counts, the prefix index, codec identities,
                           mixing dictionaries (bytes per namespace and digest, the current one,
                           and which span was coded with which)
    records/<hh>/<id>      one file per span record (``seqkv.formats.span``), <hh> = id mod 256

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
5. The schema version (``seqkv.store.binding.STORE_SCHEMA``) is recorded in ``meta``; a store of
   version 1 (none recorded) gains the sessions' ``binding`` column on open, each of its rows the
   unbound mark (an empty blob) and a ``legacy`` row holding its span and length, in one
   transaction, unless it holds a binding or mark, a ``legacy`` row or a span record of version
   2 or later (refused: ``seqkv.store.binding`` invariant 4); a store of version 2 gains the
   ``legacy`` rows of its unbound rows that name a version-1 record (invariant 3 there); a later
   version is refused by name (enforced in ``_open_schema``). Both upgrades drop the index
   entries in the same transaction (``seqkv.store.backends.base`` invariant 8). Every commit
   and delete of a session deletes its ``legacy`` row in its transaction (enforced:
   ``_FORGET_LEGACY``).
6. Every value read from the database or a record file is checked before use and every SQLite
   or file error becomes a ``SeqKVError`` naming the store (enforced: ``_read``, ``_write``,
   ``seqkv.store.backends.base`` invariant 6); a chain is read by a recursive query bounded by
   its session's length, then walked with a loop guard.
7. A record is read only from a regular file of at most ``MAX_RECORD_BYTES``: every read
   (``_record``, for ``get`` and for ``audit``/``gc``'s frame check) opens it with
   ``O_NOFOLLOW | O_NONBLOCK`` and checks ``fstat`` before reading, so a symbolic link (to
   ``/dev/zero``, say), a FIFO, a device or a folder in a record's place is ``CorruptRecordError``
   naming the span at once, never followed, waited on or read without end (enforced; tested in
   ``tests/test_store_integrity.py`` and ``tests/test_fuzz_store.py``). Assumed: the store's own
   folders (``records`` and its ``<hh>`` subfolders) are not replaced by links.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from seqkv.files import write_atomically
from seqkv.formats.span import read_frame
from seqkv.limits import MAX_CHAIN_SPANS, MAX_RECORD_BYTES
from seqkv.store.backends.base import (
    AuditReport,
    ByteCounts,
    CodecIdentity,
    CommitPlan,
    DictionaryGoneError,
    GcReport,
    IdentityCache,
    ParentGoneError,
    Schema1Evidence,
    SessionChain,
    SessionEntry,
    StoredSpan,
    Survey,
    check_schema,
    is_int,
    refuse_schema_1,
    session_entry,
    stored_int,
    walk_chain,
)
from seqkv.store.binding import SCHEMA_1_SPAN_VERSION, STORE_SCHEMA, UNBOUND, record_version
from seqkv.store.errors import (
    ConcurrentUpdateError,
    CorruptRecordError,
    SessionExistsError,
    StoreDamagedError,
    StoreError,
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
    length INTEGER NOT NULL, binding BLOB, PRIMARY KEY(ns, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idx(ns BLOB NOT NULL, key BLOB NOT NULL, span INTEGER NOT NULL,
    PRIMARY KEY(ns, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dicts(ns BLOB NOT NULL, digest TEXT NOT NULL, data BLOB NOT NULL,
    UNIQUE(ns, digest));
CREATE TABLE IF NOT EXISTS dict_current(ns BLOB PRIMARY KEY, digest TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS span_dicts(span INTEGER PRIMARY KEY, ns BLOB NOT NULL,
    digest TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS legacy(ns BLOB NOT NULL, name TEXT NOT NULL, span INTEGER NOT NULL,
    length INTEGER NOT NULL, PRIMARY KEY(ns, name)) WITHOUT ROWID;
"""
# A session's row with its legacy list entry (``seqkv.store.backends.base`` invariant 7).
_ROW = """
SELECT s.name, s.span, s.length, s.binding, l.span, l.length FROM sessions s
LEFT JOIN legacy l ON l.ns = s.ns AND l.name = s.name WHERE s.ns = ?1
"""
_FORGET_LEGACY = "DELETE FROM legacy WHERE ns = ? AND name = ?"
# NOTE: bounded by depth (a loop in the parents would recurse forever); the walk in Python
# finds the loop or the missing span among the rows.
_CHAIN = """
WITH RECURSIVE chain(id, parent, depth) AS (
    SELECT id, parent, 0 FROM spans WHERE id = ?1 AND ns = ?2
    UNION ALL SELECT s.id, s.parent, c.depth + 1 FROM spans s JOIN chain c ON s.id = c.parent
    WHERE s.ns = ?2 AND c.depth < ?3)
SELECT id, parent FROM chain
"""
_BUSY_MS = 60_000
_READ_CHUNK = 1 << 24
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


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
        self._open_schema()

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
                damaged = self._damaged(error)
                raise type(damaged)(f"cannot open the store: {damaged}") from error
            self._local.db, self._local.pid = db, os.getpid()
        return db

    def _damaged(self, error: sqlite3.Error) -> StoreError:
        """A SQLite error as the store's error: a busy or unreachable database, or a damaged
        one (a file that is not a database, a table of another shape)."""
        text = str(error)
        if isinstance(error, sqlite3.OperationalError) and any(
                word in text for word in ("locked", "unable to open", "disk I/O", "readonly")):
            return StoreUnavailableError(f"the store at {self._root}: {text}")
        return CorruptRecordError(f"the store's database at {self._root} is damaged: {text}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._connection()
        self._trips += 1
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as error:
            raise self._damaged(error) from error

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        db = self._connection()
        self._trips += 1
        try:
            db.execute("BEGIN")
            try:
                yield db
            finally:
                if db.in_transaction:
                    db.execute("COMMIT")
        except sqlite3.Error as error:
            raise self._damaged(error) from error

    def _schema(self, db: sqlite3.Connection) -> int:
        row = db.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
        return check_schema(None if row is None else row[0], str(self._root))

    def _open_schema(self) -> None:
        """Check the recorded schema version; upgrade a store of version 1 or 2 (invariant
        5)."""
        with self._read() as db:
            if self._schema(db) == STORE_SCHEMA:
                return
        with self._write() as db:
            version = self._schema(db)
            if version == STORE_SCHEMA:
                return
            columns = {str(row[1]) for row in db.execute("PRAGMA table_info(sessions)")}
            if version == 1:
                evidence = self._schema_1_evidence(db, "binding" in columns)
                refuse_schema_1(evidence, str(self._root))
                if "binding" not in columns:
                    db.execute("ALTER TABLE sessions ADD COLUMN binding BLOB")
                db.execute("INSERT INTO legacy SELECT ns, name, span, length FROM sessions")
                db.execute("UPDATE sessions SET binding = ?", (UNBOUND,))
            else:
                db.executemany("INSERT OR REPLACE INTO legacy VALUES (?, ?, ?, ?)",
                               self._schema_2_legacy(db))
            db.execute("DELETE FROM idx")  # keyed by the old hash (base invariant 8)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(STORE_SCHEMA),))

    def _schema_1_evidence(self, db: sqlite3.Connection, bindings: bool) -> Schema1Evidence:
        """What a store marked schema 1 holds that only a later schema writes (``bindings``:
        the sessions table has the column)."""
        marked = 0
        if bindings:
            marked = int(db.execute("SELECT count(*) FROM sessions WHERE binding IS NOT NULL"
                                    ).fetchone()[0])
        listed = int(db.execute("SELECT count(*) FROM legacy").fetchone()[0])
        newest = 0
        for (span,) in db.execute("SELECT id FROM spans"):
            version = self._record_version(span) if is_int(span) else None
            newest = max(newest, version or 0)
            if newest > SCHEMA_1_SPAN_VERSION:
                break
        return Schema1Evidence(marked, listed, newest)

    def _schema_2_legacy(self, db: sqlite3.Connection) -> list[tuple[object, ...]]:
        """The unbound rows of a store of schema 2 that may predate it: those whose span's
        record is of the version a store of schema 1 holds (``seqkv.store.binding``
        invariant 3)."""
        rows = db.execute("SELECT ns, name, span, length FROM sessions WHERE binding = ?",
                          (UNBOUND,)).fetchall()
        return [tuple(row) for row in rows
                if is_int(row[2]) and self._record_version(row[2]) == SCHEMA_1_SPAN_VERSION]

    def _record_version(self, span: int) -> int | None:
        """The version span ``span``'s record declares in its first byte; None where there is
        no regular, non-empty file to read it from (invariant 7: never followed or waited on)."""
        try:
            handle = os.open(self._path(span), _OPEN_FLAGS)
        except (OSError, ValueError):
            return None
        try:
            if not stat.S_ISREG(os.fstat(handle).st_mode):
                return None
            head = os.read(handle, 1)
        except OSError:
            return None
        finally:
            os.close(handle)
        return record_version(head[0]) if head else None

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
        return [None if key not in found or not is_int(found[key]) else SpanId(found[key])
                for key in keys]  # a malformed entry is no candidate (``gc`` drops it)

    def _record(self, span: int) -> bytes | None:
        """Span ``span``'s record file, read only if it is a regular file of at most
        ``MAX_RECORD_BYTES`` (invariant 7); None when it is missing."""
        what = f"span {span}'s record in {self._root}"
        try:
            handle = os.open(self._path(span), _OPEN_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as error:
            # NOTE: O_NOFOLLOW makes a symbolic link ELOOP (Linux) or EMLINK (FreeBSD).
            link = self._path(span).is_symlink()
            raise CorruptRecordError(
                f"{what} is a symbolic link, not a regular file: the store was damaged" if link
                else f"{what} cannot be read: {error.strerror or error}") from None
        try:
            info = os.fstat(handle)
            if not stat.S_ISREG(info.st_mode):
                raise CorruptRecordError(f"{what} is not a regular file (mode "
                                         f"{stat.filemode(info.st_mode)}): the store was damaged")
            if info.st_size > MAX_RECORD_BYTES:
                raise CorruptRecordError(f"{what} holds {info.st_size:,} bytes, more than a "
                                         f"record may ({MAX_RECORD_BYTES:,}): the store was "
                                         "damaged")
            chunks: list[bytes] = []
            left = info.st_size
            while left > 0:
                chunk = os.read(handle, min(left, _READ_CHUNK))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        except OSError as error:
            raise CorruptRecordError(f"{what} cannot be read: {error.strerror or error}"
                                     ) from None
        finally:
            os.close(handle)

    def _records(self, spans: Sequence[int]) -> list[bytes] | None:
        out = []
        for span in spans:
            record = self._record(span)
            if record is None:
                return None  # deleted by a concurrent release after our read
            out.append(record)
        return out

    @staticmethod
    def _chain_ids(db: sqlite3.Connection, ns: NamespaceKey, span: SpanId, limit: int,
                   label: str) -> list[SpanId]:
        """The chain through ``span``, root first: one bounded query, then a checked walk."""
        parents: dict[SpanId, SpanId | None] = {}
        for raw_id, raw_parent in db.execute(_CHAIN, (span, ns, min(limit, MAX_CHAIN_SPANS))):
            span_id = SpanId(stored_int(raw_id, f"{label}: a span's id", 1))
            parents[span_id] = (None if raw_parent is None else SpanId(
                stored_int(raw_parent, f"{label}: span {span_id}'s parent", 1)))

        def parent_of(walk: SpanId) -> SpanId | None:
            if walk not in parents:
                raise CorruptRecordError(f"{label}: the chain names span {walk}, which the "
                                         "store lacks: the store's metadata was damaged")
            return parents[walk]

        return walk_chain(label, span, limit, parent_of)

    def fetch_chain(self, ns: NamespaceKey, span: SpanId) -> tuple[StoredSpan, ...] | None:
        with self._read() as db:
            if db.execute("SELECT 1 FROM spans WHERE id = ? AND ns = ?",
                          (span, ns)).fetchone() is None:
                return None
            ids = self._chain_ids(db, ns, span, MAX_CHAIN_SPANS, f"span {span}")
        records = self._records(ids)
        if records is None:
            return None
        return tuple(StoredSpan(i, r) for i, r in zip(ids, records, strict=True))

    def _entry(self, db: sqlite3.Connection, ns: NamespaceKey, name: SessionName
               ) -> SessionEntry | None:
        row = db.execute(_ROW + " AND s.name = ?2", (ns, name)).fetchone()
        if row is None:
            return None
        return _checked_row(name, row)

    def fetch_sessions(self, ns: NamespaceKey, names: Sequence[SessionName]
                       ) -> list[SessionChain | None]:
        for _ in range(3):
            out: list[SessionChain | None] = []
            with self._read() as db:
                chains: list[tuple[SessionEntry, list[SpanId]] | None] = []
                for name in names:
                    entry = self._entry(db, ns, name)
                    if entry is None:
                        chains.append(None)
                        continue
                    ids = self._chain_ids(db, ns, entry.span, entry.length,
                                          f"session {name!r}")
                    chains.append((entry, ids))
            missing: str | None = None
            for name, item in zip(names, chains, strict=True):
                if item is None:
                    out.append(None)
                    continue
                records = self._records(item[1])
                if records is None:
                    missing = f"session {name!r}"
                    break
                out.append(SessionChain(item[0], tuple(
                    StoredSpan(i, r) for i, r in zip(item[1], records, strict=True))))
            if missing is None:
                return out
        raise CorruptRecordError(f"{missing}: a record file of its chain in {self._root} is "
                                 "missing (read three times): the store was damaged")

    def refcounts(self, ns: NamespaceKey, spans: Sequence[SpanId]) -> list[int]:
        with self._read() as db:
            marks = ",".join("?" * len(spans))
            found = dict(db.execute(
                f"SELECT id, refcount FROM spans WHERE ns = ? AND id IN ({marks})",
                (ns, *spans)).fetchall())
        return [stored_int(found.get(span, 0), f"span {span}'s reference count")
                for span in spans]

    def _release(self, db: sqlite3.Connection, span: int | None, removed: list[int]) -> None:
        # NOTE: bounded (a loop in damaged parents would not end); a malformed row stops the
        # release, leaving what ``gc`` refuses to touch until the store is repaired.
        for _ in range(MAX_CHAIN_SPANS):
            if span is None:
                return
            db.execute("UPDATE spans SET refcount = refcount - 1 WHERE id = ?", (span,))
            row = db.execute("SELECT refcount, parent FROM spans WHERE id = ?",
                             (span,)).fetchone()
            if row is None or not is_int(row[0]) or row[0] > 0:
                return
            parent = row[1] if row[1] is None or is_int(row[1]) else None
            db.execute("DELETE FROM spans WHERE id = ?", (span,))
            db.execute("DELETE FROM span_dicts WHERE span = ?", (span,))
            removed.append(span)
            span = parent
        raise CorruptRecordError(f"span {span}'s parents in {self._root} loop: the store's "
                                 "metadata was damaged")

    def _unlink(self, spans: Sequence[int]) -> None:
        for span in spans:
            self._path(span).unlink(missing_ok=True)

    def commit(self, ns: NamespaceKey, plan: CommitPlan) -> SpanId:
        removed: list[int] = []
        with self._write() as db:
            current = self._entry(db, ns, plan.session)
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
            if plan.record is not None and len(plan.record) > MAX_RECORD_BYTES:
                raise StoreError(f"a span record of {len(plan.record):,} bytes is more than the "
                                 f"directory store holds ({MAX_RECORD_BYTES:,}): put a shorter "
                                 "session, or append it in parts")
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
                write_atomically(path, plan.record)
                if plan.parent is not None:
                    db.execute("UPDATE spans SET refcount = refcount + 1 WHERE id = ?",
                               (plan.parent,))
                db.executemany(
                    "INSERT INTO idx(ns, key, span) VALUES (?, ?, ?) ON CONFLICT(ns, key) DO "
                    "UPDATE SET span = excluded.span WHERE idx.span NOT IN (SELECT id FROM spans)",
                    [(ns, key, span) for key in plan.index_keys])
            assert span is not None
            db.execute("UPDATE spans SET refcount = refcount + 1 WHERE id = ?", (span,))
            binding = UNBOUND if plan.binding is None else plan.binding(span)
            db.execute("INSERT OR REPLACE INTO sessions(ns, name, span, length, binding) "
                       "VALUES (?, ?, ?, ?, ?)", (ns, plan.session, span, plan.length, binding))
            db.execute(_FORGET_LEGACY, (ns, plan.session))
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
            db.execute(_FORGET_LEGACY, (ns, name))
            self._release(db, row[0] if is_int(row[0]) else None, removed)
        self._unlink(removed)
        return True

    def names(self, ns: NamespaceKey) -> list[SessionName]:
        with self._read() as db:
            rows = db.execute("SELECT name FROM sessions WHERE ns = ? ORDER BY name",
                              (ns,)).fetchall()
        return [SessionName(r[0]) if isinstance(r[0], str) else SessionName(repr(r[0]))
                for r in rows]

    def _files(self) -> Iterator[Path]:
        for folder in (self._root / "records").iterdir():
            if folder.is_dir():
                yield from folder.iterdir()

    def _survey(self, db: sqlite3.Connection, ns: NamespaceKey) -> Survey:
        """Mark from the sessions through their parents, checking every value (a malformed
        row, a session or span naming a span the table lacks, a loop, a record whose frame
        fails or names another parent are counted, not followed)."""
        survey = Survey()
        for raw_id, raw_parent, raw_count in db.execute(
                "SELECT id, parent, refcount FROM spans WHERE ns = ?", (ns,)):
            if not (is_int(raw_id) and is_int(raw_count)
                    and (raw_parent is None or is_int(raw_parent))):
                survey.malformed += 1
                continue
            survey.spans[raw_id] = (raw_parent, raw_count)
        for span, (parent, _) in survey.spans.items():
            if parent is not None and parent not in survey.spans:
                survey.malformed += 1
            survey.malformed += not self._frame_matches(span, parent)
        for row in db.execute(_ROW, (ns,)).fetchall():
            survey.sessions += 1
            try:
                entry = _checked_row(SessionName(str(row[0])), row)
            except CorruptRecordError:
                survey.malformed += 1
                continue
            survey.unbound += entry.binding is None
            survey.mark(entry.span)
        return survey

    def _frame_matches(self, span: int, parent: int | None) -> bool:
        """Whether span's record (if present) has a valid frame naming ``parent``."""
        try:
            data = self._record(span)
            if data is None:
                return True  # counted as a missing record
            return read_frame(data).parent == parent
        except CorruptRecordError:
            return False

    def _orphan_files(self, db: sqlite3.Connection) -> list[Path]:
        known = {r[0] for r in db.execute("SELECT id FROM spans") if is_int(r[0])}
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
            survey = self._survey(db, ns)
            spans, counts, sessions = survey.spans, survey.counts, survey.sessions
            mismatches = sum(1 for s, (_, c) in spans.items() if counts.get(s, 0) != c)
            missing = sum(1 for s in spans if not self._path(s).is_file())
            orphans = len(self._orphan_files(db))
            entries = db.execute("SELECT count(*) FROM idx WHERE ns = ?", (ns,)).fetchone()[0]
            dangling = db.execute("SELECT count(*) FROM idx WHERE ns = ? AND span NOT IN "
                                  "(SELECT id FROM spans)", (ns,)).fetchone()[0]
            dictionaries = db.execute("SELECT count(*) FROM dicts WHERE ns = ?",
                                      (ns,)).fetchone()[0]
            named = {(span, str(d)) for span, d in db.execute(
                "SELECT span, digest FROM span_dicts WHERE ns = ?", (ns,)) if is_int(span)}
            stored = {str(d) for (d,) in db.execute("SELECT digest FROM dicts WHERE ns = ?",
                                                   (ns,))}
        missing_dictionaries = sum(1 for span, d in named if span in spans and d not in stored)
        return AuditReport(sessions, len(spans), mismatches, missing, orphans, int(dangling),
                           int(entries), int(dictionaries), missing_dictionaries,
                           survey.malformed, survey.unbound)

    def gc(self, ns: NamespaceKey) -> GcReport:
        with self._write() as db:
            survey = self._survey(db, ns)
            if survey.malformed:
                raise StoreDamagedError(
                    f"the store at {self._root} holds {survey.malformed} malformed rows or "
                    "records in this namespace: gc would delete what a session may need; run "
                    "seqkv store audit --deep to name the damaged sessions, repair or delete "
                    "them, then gc")
            orphans = self._orphan_files(db)
            for path in orphans:
                path.unlink(missing_ok=True)
            spans, counts, reachable = survey.spans, survey.counts, survey.reachable
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


def _checked_row(name: SessionName, row: sqlite3.Row | tuple[object, ...]) -> SessionEntry:
    """A row of ``_ROW`` (name, span, length, binding, listed span, listed length), checked."""
    legacy = None if row[4] is None and row[5] is None else (row[4], row[5])
    return session_entry(name, row[1], row[2], row[3], legacy)

"""The backend seam: the few atomic operations the store needs from a directory or Redis.

Data model (per namespace): span records (immutable, ``seqkv.formats.span``), a reference count
per span, a session table (id -> the span holding the session's last token, and its length) and
the prefix index (key -> span). A span's reference count is the number of sessions whose entry
names it plus the number of spans whose parent it is. Mixing dictionaries (``seqkv.mixing``) are
kept per namespace too: their bytes by digest, which one is current, and per span the digest of
the dictionary it was coded with (if any).

Invariants every backend keeps:
1. ``commit`` is atomic: the new span, its index entries, the reference counts and the session
   entry all become visible together or not at all, also across ``kill -9`` of the writer
   (enforced per backend; fault-tested).
2. A span with reference count 0 is deleted in the same atomic step that made it 0, and the
   release cascades to its parent (enforced), so ``audit`` finds counts equal to a recount.
3. A commit whose parent span is gone, whose session exists (create) or changed (append) changes
   nothing and raises (enforced).
4. Span ids only grow and are never reused (enforced: a counter), so a cached decoded span can
   never stand for another span's tokens.
5. A span that names a dictionary is committed only while its namespace stores that dictionary
   (checked inside the atomic commit, else ``DictionaryGoneError`` and nothing changes); ``gc``
   removes a dictionary only when no span of the namespace that a session reaches names it and
   it is not the namespace's current one, in the same atomic step (enforced). Dictionaries are
   looked up only under the asking namespace's key (enforced: every key holds it).
6. Every value a backend reads is checked before use (``session_entry``, ``walk_chain``,
   ``stored_int``): a row or record that damage or a hostile writer changed ends in
   ``CorruptRecordError`` naming the session or span, never in another exception, an endless
   walk (a chain loops or runs past ``MAX_CHAIN_SPANS`` or its session's length: enforced) or a
   silently shorter session.
7. Each session row carries its binding (``seqkv.store.binding``) since store schema 2, or the
   mark of an unbound row that the upgrade from schema 1 wrote on each older row and recorded,
   with the row's span and length, in the namespace's legacy list. An unbound row is read only
   while the list holds it with that span and length; a row with neither a binding nor the mark
   is refused (enforced by both backends: ``session_entry``, given the row and its list entry
   read in one request). A commit or delete of a session drops its list entry in the same
   atomic step (enforced per backend), so a damaged row can never become one the list vouches
   for. A store marked schema 1 (or unmarked) that holds what only a later schema writes is
   refused, not upgraded (enforced per backend; the rule is ``refuse_schema_1``).
8. The prefix index is derived data, keyed by ``seqkv.store.index.chain_keys`` (the one block
   hash, ``seqkv.blockhash``), which stores of schema 1 and 2 did not use: the upgrade to schema
   3 drops every index entry in the same atomic step that records the schema (enforced per
   backend), rather than rebuild them, because their keys are hashes of each session's tokens
   and a backend cannot decode a session (the tokens are coded under the model, which a store
   opens without). An old entry could never hit under the new keys but by a truncated-key
   collision (a wasted candidate decode, never a wrong match: ``seqkv.store.prefixes``
   invariant 1), so dropping loses only this: a put does not find the prefixes of sessions
   stored before the upgrade, and codes them again (its own entries are written as usual).
   Every session stays readable; rows, spans and counts are not touched (enforced).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from seqkv.formats.span import SpanFrame
from seqkv.limits import MAX_CHAIN_SPANS, MAX_POSITIONS, MAX_SPAN_ID
from seqkv.store.binding import (
    BINDING_BYTES,
    SCHEMA_1_SPAN_VERSION,
    STORE_SCHEMA,
    UNBOUND,
    Binding,
)
from seqkv.store.errors import CorruptRecordError, StoreSchemaError, StoreSchemaMarkError
from seqkv.store.ids import CodecDigest, NamespaceKey, SessionName, SpanId


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer as a backend returns one (a bool is not).

    >>> is_int(3), is_int("3"), is_int(True)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def stored_int(value: object, what: str, low: int = 0, high: int = MAX_SPAN_ID) -> int:
    """``value`` read from a backend as an integer in ``[low, high]``, else
    ``CorruptRecordError`` naming ``what``.

    >>> stored_int(b"12", "a count")
    12
    >>> stored_int("x", "a count", 0, 9)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    seqkv.errors.CorruptRecordError: a count is 'x', not an integer in [0, 9]: the store's ...
    """
    number: int | None = None
    if is_int(value):
        number = int(value)  # type: ignore[call-overload]
    elif isinstance(value, bytes | str):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if 0 < len(text) <= 20 and text.isascii() and (text.isdigit() or (
                text[0] == "-" and text[1:].isdigit())):
            number = int(text)
    if number is None or not low <= number <= high:
        shown = value if not isinstance(value, bytes) else value[:40]
        raise CorruptRecordError(f"{what} is {shown!r}, not an integer in [{low}, {high}]: the "
                                 "store's metadata was damaged")
    return number


def session_entry(name: SessionName, span: object, length: object, binding: object,
                  legacy: tuple[object, object] | None = None) -> SessionEntry:
    """A session row as a backend read it, checked (invariants 6 and 7): ``binding`` is the
    row's binding, or ``UNBOUND`` for a row of schema 1 that ``legacy`` (the (span, length)
    the namespace's legacy list holds for the session, None: none) lists as it is; anything
    else refused.

    >>> session_entry(SessionName("s"), 4, 9, UNBOUND, (4, 9))
    SessionEntry(span=4, length=9, binding=None)
    >>> session_entry(SessionName("s"), 4, 7, UNBOUND, (4, 9))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    seqkv.errors.CorruptRecordError: session 's''s row (span 4, length 7) has no binding ...
    """
    what = f"session {name!r}'s row"
    checked = SessionEntry(SpanId(stored_int(span, f"{what}'s span", 1)),
                           stored_int(length, f"{what}'s length", 1, MAX_POSITIONS))
    if binding == UNBOUND:
        if not is_listed(checked, legacy):
            raise CorruptRecordError(
                f"{what} (span {checked.span}, length {checked.length}) has no binding and is "
                f"not a row the upgrade from schema 1 listed"
                f"{'' if legacy is None else ' as it is'}: the row was damaged (a binding "
                "cannot be switched off)")
        return checked
    if binding is None:
        raise CorruptRecordError(
            f"{what} has no binding and no mark of a row of schema 1: the row was damaged or "
            "written by hand")
    if not isinstance(binding, bytes) or len(binding) != BINDING_BYTES:
        raise CorruptRecordError(f"{what} has a malformed binding: the row was damaged")
    return SessionEntry(checked.span, checked.length, Binding(binding))


def is_listed(entry: SessionEntry, legacy: tuple[object, object] | None) -> bool:
    """Whether the legacy list's entry ``legacy`` (raw span and length; None: none) names
    ``entry``'s span and length (invariant 7); a malformed entry lists nothing."""
    if legacy is None:
        return False
    try:
        listed = (stored_int(legacy[0], "a legacy row's span", 1),
                  stored_int(legacy[1], "a legacy row's length", 1, MAX_POSITIONS))
    except CorruptRecordError:
        return False
    return listed == (entry.span, entry.length)


def walk_chain(label: str, span: SpanId, limit: int,
               parent_of: Callable[[SpanId], SpanId | None]) -> list[SpanId]:
    """The spans from the root to ``span``, following ``parent_of`` (which raises
    ``CorruptRecordError`` for a span the store lacks); a loop, or more than ``limit`` spans,
    is ``CorruptRecordError`` naming ``label`` (invariant 6).

    >>> walk_chain("s", SpanId(3), 8, {3: 2, 2: None}.__getitem__)
    [2, 3]
    >>> walk_chain("s", SpanId(3), 8, {3: 2, 2: 3}.__getitem__)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    seqkv.errors.CorruptRecordError: s: the chain through span 3 loops at span 3: the ...
    """
    chain: list[SpanId] = []
    seen: set[SpanId] = set()
    walk: SpanId | None = span
    while walk is not None:
        if walk in seen:
            raise CorruptRecordError(f"{label}: the chain through span {span} loops at span "
                                     f"{walk}: the store's metadata was damaged")
        if len(chain) >= min(limit, MAX_CHAIN_SPANS):
            raise CorruptRecordError(f"{label}: the chain through span {span} holds more than "
                                     f"{min(limit, MAX_CHAIN_SPANS)} spans: the store's metadata "
                                     "was damaged")
        seen.add(walk)
        chain.append(walk)
        walk = parent_of(walk)
    chain.reverse()
    return chain


def check_schema(recorded: object, where: str) -> int:
    """The schema version a store records (``None``: 1, written before versions were), or
    ``StoreSchemaError`` for a later one.

    >>> check_schema(None, "x"), check_schema(b"2", "x")
    (1, 2)
    """
    if recorded is None:
        return 1
    version = stored_int(recorded, f"the schema version of the store at {where}", 1)
    if version > STORE_SCHEMA:
        raise StoreSchemaError(
            f"the store at {where} has schema version {version}; this seqkv reads versions 1 to "
            f"{STORE_SCHEMA}: use the seqkv release that wrote it")
    return version


@dataclass(frozen=True, slots=True)
class Schema1Evidence:
    """What an upgrade from schema 1 found that only a later schema writes."""

    marked_rows: int  # session rows with a binding or the unbound mark
    listed_rows: int  # entries of a legacy list
    newest_record: int  # the highest span record version found (0: none read)

    @property
    def contradicts(self) -> bool:
        """Whether a store holding this cannot be of schema 1."""
        return (self.marked_rows > 0 or self.listed_rows > 0
                or self.newest_record > SCHEMA_1_SPAN_VERSION)


def refuse_schema_1(evidence: Schema1Evidence, where: str) -> None:
    """``StoreSchemaMarkError`` when a store marked schema 1 (or unmarked) holds ``evidence``
    of a later schema (``seqkv.store.binding`` invariant 4).

    >>> refuse_schema_1(Schema1Evidence(0, 0, 1), "x")
    >>> refuse_schema_1(Schema1Evidence(2, 0, 2), "x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    seqkv.store.errors.StoreSchemaMarkError: the store at x is marked schema 1 (or not ...
    """
    if not evidence.contradicts:
        return
    found = [f"{what}: {count}" for count, what in (
        (evidence.marked_rows, "session rows with a binding or the unbound mark"),
        (evidence.listed_rows, "rows on a legacy list")) if count]
    if evidence.newest_record > SCHEMA_1_SPAN_VERSION:
        found.append(f"span records of version {evidence.newest_record}")
    raise StoreSchemaMarkError(
        f"the store at {where} is marked schema 1 (or not marked) but holds "
        f"{', '.join(found)}, which only schema 2 or later writes: its schema mark was damaged. "
        "Refused rather than upgraded (an upgrade would take damaged rows for old ones): "
        f"record schema {STORE_SCHEMA} again (the directory's meta table, Redis' "
        "<prefix>:meta hash), or restore the store from a backup")


@dataclass(frozen=True, slots=True)
class CodecIdentity:
    """What a store records once per codec: a digest and the JSON description it digests."""

    digest: CodecDigest
    description: str  # canonical JSON (sorted keys); holds at least "codec" and "level"
    level: str

    @classmethod
    def of(cls, description: Mapping[str, object]) -> CodecIdentity:
        """The identity of ``description`` (canonical JSON, SHA-256).

        >>> CodecIdentity.of({"codec": "x", "level": "plain"}).digest[:12]
        'dc9a8b75c541'
        """
        text = json.dumps(description, sort_keys=True, separators=(",", ":"), default=str)
        level = str(description.get("level", ""))
        return cls(CodecDigest(hashlib.sha256(text.encode()).hexdigest()), text, level)

    @classmethod
    def stored(cls, text: str | bytes, index: int) -> CodecIdentity:
        """The identity a backend stored as ``text``, checked: a JSON object naming its codec
        and level (``CorruptRecordError`` otherwise)."""
        try:
            description = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError) as error:
            raise CorruptRecordError(
                f"the store's codec {index} is not JSON: {str(error)[:200]}") from None
        if not (isinstance(description, dict) and isinstance(description.get("codec"), str)
                and isinstance(description.get("level"), str)):
            raise CorruptRecordError(f"the store's codec {index} is not a codec description")
        return cls.of(description)


class IdentityCache:
    """A backend's codec table and store id, cached in this process: what both backends share.

    Identities never change once stored (a codec's index names it forever), so a cached entry is
    never stale.
    """

    def __init__(self) -> None:
        self._by_index: dict[int, CodecIdentity] = {}
        self._by_digest: dict[CodecDigest, int] = {}
        self._store_id: str | None = None

    def register(self, identity: CodecIdentity, add: Callable[[CodecIdentity], int]) -> int:
        """The identity's index, stored by ``add`` on first use."""
        if identity.digest not in self._by_digest:
            index = add(identity)
            self._by_digest[identity.digest] = index
            self._by_index[index] = identity
        return self._by_digest[identity.digest]

    def codec(self, index: int, fetch: Callable[[int], str | bytes | None]) -> CodecIdentity:
        """The identity stored under ``index``, read by ``fetch`` on first use."""
        if index not in self._by_index:
            text = fetch(index)
            if text is None:
                raise CorruptRecordError(f"a span names codec {index}, which the store lacks")
            self._by_index[index] = CodecIdentity.stored(text, index)
        return self._by_index[index]

    def store_id(self, fetch: Callable[[], str]) -> str:
        if self._store_id is None:
            self._store_id = fetch()
        return self._store_id


class ParentGoneError(Exception):
    """Internal: the span a commit builds on was deleted meanwhile; the store retries."""


class DictionaryGoneError(Exception):
    """Internal: the dictionary a commit's span was coded with is not (or no longer) stored in
    its namespace; the store retries with the namespace's current one."""


@dataclass(frozen=True, slots=True)
class StoredSpan:
    span: SpanId
    record: bytes
    # ``read_frame(record)``, where the backend read it already (to walk the chain), so the
    # store parses no record twice in one call; None: not read
    frame: SpanFrame | None = None


@dataclass(frozen=True, slots=True)
class SessionEntry:
    span: SpanId  # the span holding the session's last token
    length: int  # tokens of the session
    binding: Binding | None = None  # ``seqkv.store.binding``; None: unbound, of schema 1


@dataclass(frozen=True, slots=True)
class SessionChain:
    entry: SessionEntry
    chain: tuple[StoredSpan, ...]  # root span first, ``entry.span`` last


@dataclass(frozen=True, slots=True)
class CommitPlan:
    """One atomic change: create a session (``expect is None``) or move it (append)."""

    session: SessionName
    length: int
    expect: SessionEntry | None
    record: bytes | None  # a new span continuing ``parent``; None: the session ends in ``parent``
    parent: SpanId | None
    index_keys: tuple[bytes, ...]  # keys that name the new span (set where absent or dangling)
    dictionary: str | None = None  # the digest of the dictionary ``record`` was coded with
    # The row's binding (``seqkv.store.binding``): a function of the session's span, which for a
    # new span only the backend knows, hence a function of it.
    binding: Callable[[SpanId], Binding] | None = None


@dataclass(frozen=True, slots=True)
class AuditReport:
    """A recount of one namespace against its stored reference counts."""

    sessions: int
    spans: int
    refcount_mismatches: int
    missing_records: int  # spans with a count but no record (never expected)
    orphan_records: int  # records without a count: garbage of a crashed writer
    dangling_index_entries: int  # index entries naming deleted spans (harmless; gc drops them)
    index_entries: int
    dictionaries: int = 0  # stored in the namespace
    missing_dictionaries: int = 0  # named by a live span but not stored (never expected)
    # rows or records of malformed values (text where a number belongs, a span naming a span the
    # table lacks, a loop, a record too short to name its parent): never expected; ``gc`` refuses
    malformed: int = 0
    # session rows without a binding that the legacy list vouches for (written at schema 1; not
    # damage); an unbound row the list does not hold is malformed
    unbound: int = 0

    @property
    def consistent(self) -> bool:
        return (self.refcount_mismatches == 0 and self.missing_records == 0
                and self.missing_dictionaries == 0 and self.malformed == 0)


@dataclass(slots=True)
class Survey:
    """What a backend's audit marks: checked spans (id -> parent, stored count), the recount,
    the spans sessions reach, and what it could not follow."""

    spans: dict[int, tuple[int | None, int]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    reachable: set[int] = field(default_factory=set)
    sessions: int = 0
    malformed: int = 0
    unbound: int = 0

    def mark(self, span: int) -> None:
        """Count one session naming ``span`` and mark its chain; a span the table lacks or a
        loop is malformed (each found once per session)."""
        self.counts[span] = self.counts.get(span, 0) + 1
        path: set[int] = set()
        walk: int | None = span
        while walk is not None:
            if walk not in self.spans or walk in path:
                self.malformed += 1
                return
            if walk in self.reachable:
                return
            path.add(walk)
            self.reachable.add(walk)
            parent = self.spans[walk][0]
            if parent is not None:
                self.counts[parent] = self.counts.get(parent, 0) + 1
            walk = parent


@dataclass(frozen=True, slots=True)
class GcReport:
    orphan_records_removed: int
    index_entries_removed: int
    refcounts_fixed: int
    spans_removed: int
    dictionaries_removed: int = 0  # neither current nor named by a span a session reaches


@dataclass(frozen=True, slots=True)
class ByteCounts:
    """Logical bytes of one namespace: what the backend stores, before its own overheads."""

    records: int  # span record bytes
    spans: int
    index: int  # index keys + values
    index_entries: int
    sessions: int  # session table: ids + entries
    session_ids: int  # of which the ids themselves
    refcounts: int  # span id + count per span
    # What the backend itself reports: Redis MEMORY USAGE of the namespace's keys, or the blocks
    # on disk of the whole directory store (its records and database are not per namespace).
    backend_bytes: int | None
    dictionaries: int = 0  # bytes of the namespace's stored dictionaries

    @property
    def metadata(self) -> int:
        """Everything but the records and the session ids."""
        return self.index + (self.sessions - self.session_ids) + self.refcounts


class StoreBackend(Protocol):
    """Where a ``SessionStore`` keeps its spans, sessions and index."""

    @property
    def round_trips(self) -> int:
        """Requests sent so far (a pipeline or a script counts once)."""
        ...

    def store_id(self) -> str: ...

    def register_codec(self, identity: CodecIdentity) -> int:
        """The codec's index in the store's table, adding it if new (idempotent)."""
        ...

    def codec(self, index: int) -> CodecIdentity: ...

    def lookup(self, ns: NamespaceKey, keys: Sequence[bytes]) -> list[SpanId | None]:
        """The span each index key names (None: absent), in one request."""
        ...

    def fetch_chain(self, ns: NamespaceKey, span: SpanId) -> tuple[StoredSpan, ...] | None:
        """The records from the root to ``span``, in one request; None if ``span`` is gone."""
        ...

    def fetch_sessions(self, ns: NamespaceKey, names: Sequence[SessionName]
                       ) -> list[SessionChain | None]:
        """Each session's entry and chain, in one request."""
        ...

    def refcounts(self, ns: NamespaceKey, spans: Sequence[SpanId]) -> list[int]: ...

    def commit(self, ns: NamespaceKey, plan: CommitPlan) -> SpanId:
        """Apply ``plan`` atomically; return the session's span. Raises ``SessionExistsError``,
        ``ConcurrentUpdateError`` or ``ParentGoneError`` and then changes nothing."""
        ...

    def delete(self, ns: NamespaceKey, name: SessionName) -> bool:
        """Remove a session and release its chain; False if it did not exist."""
        ...

    def names(self, ns: NamespaceKey) -> list[SessionName]: ...

    def audit(self, ns: NamespaceKey) -> AuditReport: ...

    def gc(self, ns: NamespaceKey) -> GcReport:
        """Remove what crashed writers left, fix counts that differ from a recount, drop
        dangling index entries and spans nothing references."""
        ...

    def byte_counts(self, ns: NamespaceKey) -> ByteCounts: ...

    def put_dictionary(self, ns: NamespaceKey, digest: str, data: bytes) -> bool:
        """Store ``data`` under ``digest`` (if absent) and make it the namespace's current
        dictionary, atomically; True if it was not stored before."""
        ...

    def current_dictionary(self, ns: NamespaceKey) -> str | None:
        """The digest of the namespace's current dictionary (None: none was put)."""
        ...

    def fetch_dictionary(self, ns: NamespaceKey, digest: str) -> bytes | None:
        """The bytes the namespace stores under ``digest`` (None: it stores none)."""
        ...

    def dictionary_digests(self, ns: NamespaceKey) -> list[str]:
        """The digests the namespace stores, sorted."""
        ...

    def close(self) -> None: ...

"""The backend seam: the few atomic operations the store needs from a directory or Redis.

Data model (per namespace): span records (immutable, ``seqkv.store.record``), a reference count
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
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from seqkv.store.errors import CorruptRecordError
from seqkv.store.ids import CodecDigest, NamespaceKey, SessionName, SpanId


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
        except (ValueError, UnicodeDecodeError) as error:
            raise CorruptRecordError(f"the store's codec {index} is not JSON: {error}") from None
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


@dataclass(frozen=True, slots=True)
class SessionEntry:
    span: SpanId  # the span holding the session's last token
    length: int  # tokens of the session


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

    @property
    def consistent(self) -> bool:
        return (self.refcount_mismatches == 0 and self.missing_records == 0
                and self.missing_dictionaries == 0)


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

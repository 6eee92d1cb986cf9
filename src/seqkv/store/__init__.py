"""``seqkv.store``: a shared session store on a local directory or Redis.

Put a session's KV in, get it back exactly on any worker, append the next turn without re-coding
earlier ones, and keep every shared prefix once across the fleet::

    store = SessionStore.directory("sessions/", model)      # or SessionStore.redis(url, model)
    store.put("chat-1", tokens, kv, namespace="tenant-a")   # level "portable" by default
    store.put_dictionary(dictionary, namespace="tenant-a")  # built for "tenant-a"
    store.put("doc-1", tokens, kv, level="portable+mix", namespace="tenant-a")
    store.append("chat-1", next_turn, namespace="tenant-a")
    session = store.get("chat-1", namespace="tenant-a")     # tokens, DynamicCache, KV, kv_exact

Modules: ``store`` (``SessionStore``), ``codec`` (the ``SessionCodec`` seam), ``skv_adapter``
(the codec over today's ``seqkv.compress``, and a tokens-only codec), ``record`` (the span record
format), ``index`` (the prefix index), ``backend`` / ``directory`` / ``redis_backend`` (where it
is kept), ``hot`` (decoded spans kept in memory), ``hf`` (``save_cache`` / ``load_cache``),
``jobs`` (JSON-lines batch jobs, Ray Data), ``fleet`` (worker processes), ``redis_server`` (a
private redis-server for tests and benchmarks).

Invariants:
1. Importing the package computes nothing and holds no mutable state (enforced: modules define
   classes, functions and constants only; the Redis, Ray and SQLite modules load on use).
"""

from seqkv.store.backend import AuditReport, ByteCounts, GcReport, StoreBackend
from seqkv.store.codec import (
    CodecIdentity,
    DecodedSpan,
    DictionaryCodec,
    EncodedSpan,
    PrefixState,
    SessionCodec,
)
from seqkv.store.errors import (
    BatchInputError,
    CodecMismatchError,
    ConcurrentUpdateError,
    CorruptRecordError,
    DictionaryNamespaceError,
    InvalidSessionIdError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
    StoreUnavailableError,
    StoreVerificationError,
)
from seqkv.store.hf import SavedCache, load_cache, save_cache
from seqkv.store.index import IndexSpacing
from seqkv.store.skv_adapter import DEFAULT_STORE_LEVEL, PortableTokenCodec, SkvCodec
from seqkv.store.store import (
    CodecFactory,
    PrefixMatch,
    PutResult,
    SessionStat,
    SessionStore,
    StoredDictionary,
    StoredSession,
    skv_codecs,
)

__all__ = [
    "DEFAULT_STORE_LEVEL",
    "AuditReport",
    "BatchInputError",
    "ByteCounts",
    "CodecFactory",
    "CodecIdentity",
    "CodecMismatchError",
    "ConcurrentUpdateError",
    "CorruptRecordError",
    "DecodedSpan",
    "DictionaryCodec",
    "DictionaryNamespaceError",
    "EncodedSpan",
    "GcReport",
    "IndexSpacing",
    "InvalidSessionIdError",
    "PortableTokenCodec",
    "PrefixMatch",
    "PrefixState",
    "PutResult",
    "SavedCache",
    "SessionCodec",
    "SessionExistsError",
    "SessionNotFoundError",
    "SessionStat",
    "SessionStore",
    "SkvCodec",
    "StoreBackend",
    "StoreError",
    "StoreUnavailableError",
    "StoreVerificationError",
    "StoredDictionary",
    "StoredSession",
    "load_cache",
    "save_cache",
    "skv_codecs",
]

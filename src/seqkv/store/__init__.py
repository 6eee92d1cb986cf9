"""``seqkv.store``: a shared session store on a local directory or Redis.

Put a session's KV in, get it back exactly on any worker, append the next turn without re-coding
earlier ones, and keep every shared prefix once across the fleet::

    store = SessionStore.directory("sessions/", model)      # or SessionStore.redis(url, model)
    store.put("chat-1", tokens, kv, namespace="tenant-a")   # level "portable" by default
    store.put_dictionary(dictionary, namespace="tenant-a")  # built for "tenant-a"
    store.put("doc-1", tokens, kv, level="portable+mix", namespace="tenant-a")
    store.append("chat-1", next_turn, namespace="tenant-a")
    session = store.get("chat-1", namespace="tenant-a")     # tokens, DynamicCache, KV, kv_exact

Modules, one concern each: ``store`` (``SessionStore``, composing the rest), ``prefixes``
(finding a new session's longest stored prefix), ``chains`` (decoding chains of spans),
``dictionaries`` (each namespace's mixing dictionaries), ``codec`` (the ``SpanCodec`` seam),
``codecs`` (the model's codec and a tokens-only one), ``registry`` (codecs by level and by
stored index), ``index`` (the prefix index keys), ``hot`` (what a worker keeps in memory),
``backends`` (where it is kept: ``base``, ``directory``, ``redis``), ``hf`` (``save_cache`` /
``load_cache``), ``jobs`` (JSON-lines batch jobs, Ray Data), ``fleet`` (worker processes). The
span record's bytes are a format of the coded session (``seqkv.formats.span``).

Invariants:
1. Importing the package computes nothing and holds no mutable state (enforced: modules define
   classes, functions and constants only; the Redis, Ray and SQLite modules load on use).
"""

from seqkv.store.backends.base import (
    AuditReport,
    ByteCounts,
    CodecIdentity,
    GcReport,
    StoreBackend,
)
from seqkv.store.codec import DecodedSpan, EncodedSpan, SpanCodec, SpanItem
from seqkv.store.codecs import DEFAULT_STORE_LEVEL, ModelCodec, TokensCodec
from seqkv.store.dictionaries import StoredDictionary
from seqkv.store.errors import (
    BatchInputError,
    CodecMismatchError,
    ConcurrentUpdateError,
    CorruptRecordError,
    DictionaryNamespaceError,
    InvalidSessionIdError,
    SessionExistsError,
    SessionNotFoundError,
    SessionTooLongError,
    StoreDamagedError,
    StoreError,
    StoreSchemaError,
    StoreSchemaMarkError,
    StoreUnavailableError,
    StoreVerificationError,
)
from seqkv.store.hf import SavedCache, load_cache, save_cache
from seqkv.store.index import IndexSpacing
from seqkv.store.registry import CodecFactory, model_codecs
from seqkv.store.store import (
    DamagedSession,
    DeepAuditReport,
    PrefixMatch,
    PutResult,
    SessionStat,
    SessionStore,
    StoredSession,
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
    "DamagedSession",
    "DecodedSpan",
    "DeepAuditReport",
    "DictionaryNamespaceError",
    "EncodedSpan",
    "GcReport",
    "IndexSpacing",
    "InvalidSessionIdError",
    "ModelCodec",
    "PrefixMatch",
    "PutResult",
    "SavedCache",
    "SessionExistsError",
    "SessionNotFoundError",
    "SessionStat",
    "SessionStore",
    "SessionTooLongError",
    "SpanCodec",
    "SpanItem",
    "StoreBackend",
    "StoreDamagedError",
    "StoreError",
    "StoreSchemaError",
    "StoreSchemaMarkError",
    "StoreUnavailableError",
    "StoreVerificationError",
    "StoredDictionary",
    "StoredSession",
    "TokensCodec",
    "load_cache",
    "model_codecs",
    "save_cache",
]

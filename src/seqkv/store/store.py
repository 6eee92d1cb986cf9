"""``SessionStore``: sessions' KV stored once across a fleet, on a directory or on Redis.

Motivation: one ``.skv`` file per session repeats its model identity, profile and checksums
(about 1 KB of JSON) and every shared prefix. The store keeps each codec identity once, each
shared prefix once (as a span that every session extending it references), and per span only
the codec's payload in a small record (``seqkv.store.record``). A session is a chain of spans:
put codes the tokens after the longest stored prefix, append codes only the new turn against
the stored session.

A put: compute the index keys of the new session (``seqkv.store.index``), look them all up in
one request, decode (or find hot) the deepest candidate's chain, compare its tokens with the
session's to find the exact shared length, code the rest against it, and commit the new span,
its index entries, the counts and the session entry in one atomic backend call. A get: fetch
every asked session's chain in one request, decode the spans not hot, parents first, each round
one ``decode_many`` per codec (sessions share forwards).

Invariants:
1. A session is never coded against a prefix whose tokens were not compared with its own: an
   index hit only names a candidate (enforced in ``_match``; tested with colliding 1-byte keys).
2. A span's prefix state is exactly what a decoder rebuilds: the parent chain's decoded tokens
   and KV, cut at ``start`` (enforced: states come only from decoding or from ``EncodedSpan.kv``,
   which the codec checked against its digest).
3. Namespaces are disjoint: every backend key and index hash is derived from the namespace, and a
   session missing from the asked namespace raises ``SessionNotFoundError`` with the message a
   never-stored id gets, after the same single request (enforced).
4. Reference counts change only inside backend commits (``seqkv.store.backend``).
5. Each namespace keeps its own mixing dictionaries (issue 16): ``put_dictionary`` stores one
   under its digest and makes it the namespace's current one; a put or append at a level that
   mixes (``portable+mix``) codes with the namespace's current dictionary and its span names
   that digest; decoding looks the digest up in the span's own namespace only. A dictionary
   built for another namespace is refused (``DictionaryNamespaceError``), so one tenant's
   dictionary never codes another's sessions, and a digest missing from the asked namespace
   raises ``DictionaryUnavailableError`` with the message a digest stored nowhere gets
   (enforced; tested on both backends). ``gc`` keeps every dictionary a live span names and the
   current one (``seqkv.store.backend`` invariant 5).

The default level is ``portable`` (issue 15): its tokens decode on any machine with the model's
weights; the KV is exact on the encoder's execution profile.

What mutates: ``put``/``append``/``delete``/``gc``/``put_dictionary`` change the backend;
``put``, ``append``, ``get`` and ``get_many`` also fill this process's hot tier, and every call
that reads a dictionary fills this process's dictionary cache (immutable, content-addressed
entries keyed by namespace and digest).

Limits: a ``SessionStore`` object serves one thread (its hot tier is unlocked); open one per
thread or process, all on the same backend. Two writers that code the same new prefix at the
same moment both store it (each finds nothing in the index); later sessions reference the one the
index names first, as with vLLM's concurrently computed blocks.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from seqkv.codec import DEFAULT_TOLERANCE
from seqkv.errors import EmptyInputError, InvalidKVError
from seqkv.kvcache import cache_from_tensor, tensor_from_cache
from seqkv.mixing.dictionary import Dictionary, DictionaryDigest
from seqkv.mixing.errors import CorruptDictionaryError, DictionaryUnavailableError
from seqkv.models.adapter import CausalLM
from seqkv.store.backend import (
    AuditReport,
    ByteCounts,
    CommitPlan,
    DictionaryGoneError,
    GcReport,
    ParentGoneError,
    SessionChain,
    SessionEntry,
    StoreBackend,
    StoredSpan,
)
from seqkv.store.codec import (
    DecodedSpan,
    DictionaryCodec,
    EncodedSpan,
    PrefixState,
    SessionCodec,
)
from seqkv.store.errors import (
    CodecMismatchError,
    ConcurrentUpdateError,
    CorruptRecordError,
    DictionaryNamespaceError,
    SessionExistsError,
    SessionNotFoundError,
)
from seqkv.store.hot import ChainState, HotKey, HotTier
from seqkv.store.ids import (
    NamespaceKey,
    SessionName,
    SpanId,
    StoreNamespace,
    check_namespace,
    check_session_id,
    namespace_key,
)
from seqkv.store.index import IndexSpacing, chain_keys
from seqkv.store.record import SpanRecord, pack, unpack
from seqkv.store.skv_adapter import DEFAULT_STORE_LEVEL, SkvCodec, missing_dictionary

CodecFactory = Callable[[str], SessionCodec]
"""Gives the codec for a level name (``"rows"``, ``"ngram"``, ...)."""

# NOTE: 256 MiB holds the decoded KV of ~11,000 SmolLM2-135M tokens (23,040 float32 bytes each).
DEFAULT_HOT_BYTES = 256 << 20
# NOTE: 64 MiB holds ~30 dictionaries of the default policy's largest (2**20 tokens at 2 bytes).
DEFAULT_DICTIONARY_CACHE_BYTES = 64 << 20
_RETRIES = 8


@dataclass(frozen=True)
class StoredSession:
    """A session read back: its tokens and the KV a decoder rebuilt, checked against digests."""

    session: SessionName
    namespace: StoreNamespace
    tokens: list[int]
    cache: DynamicCache | None
    kv: torch.Tensor | None  # [layers, 2, kv_heads, tokens, head_dim] float32; None: no KV
    kv_exact: bool  # the KV equals what was put, bit for bit (or the recompute, where none was)


@dataclass(frozen=True, slots=True)
class PutResult:
    session: SessionName
    tokens: int  # of the session
    shared_tokens: int  # found stored and not coded again
    coded_tokens: int
    span: SpanId  # the span holding the session's last token
    record_bytes: int  # stored for this call (0: nothing new was coded)
    coded_bytes: int  # of which coded tokens and residual
    container_bytes: int  # what a standalone .skv of the coded tokens would have been
    candidates: int  # index candidates decoded or found hot
    round_trips: int


@dataclass(frozen=True, slots=True)
class SessionStat:
    session: SessionName
    tokens: int
    spans: int
    bytes: int  # records of the session's whole chain
    shared_prefix_bytes: int  # of which in spans that other sessions or spans also reference
    kv_exact: bool


@dataclass(frozen=True, slots=True)
class StoredDictionary:
    """A dictionary put into a namespace: now its current one."""

    digest: DictionaryDigest
    namespace: StoreNamespace
    tokens: int
    bytes: int
    created: bool  # False: the namespace already stored this digest (it is current again)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The longest stored prefix of some tokens, verified token by token."""

    length: int
    candidates: int  # index candidates decoded or found hot
    round_trips: int


@dataclass(frozen=True, slots=True)
class _Match:
    length: int
    state: ChainState | None
    candidates: int


def skv_codecs(model: CausalLM, tolerance: float = DEFAULT_TOLERANCE) -> CodecFactory:
    """A factory of ``SkvCodec``s over ``model``, one per level, made on first use."""
    made: dict[str, SessionCodec] = {}

    def factory(level: str) -> SessionCodec:
        if level not in made:
            made[level] = SkvCodec(model, level, tolerance)
        return made[level]

    return factory


def _kv_tensor(kv: DynamicCache | torch.Tensor | None) -> torch.Tensor | None:
    if kv is None:
        return None
    tensor = tensor_from_cache(kv) if isinstance(kv, DynamicCache) else kv
    if tensor.dim() != 5 or tensor.shape[1] != 2:
        raise InvalidKVError(f"expected a [layers, 2, heads, tokens, dim] KV, got {tensor.shape}")
    return tensor.detach().to("cpu", torch.float32)


def _mixes(codec: SessionCodec) -> DictionaryCodec | None:
    """``codec`` as a ``DictionaryCodec`` if it codes with a dictionary, else None."""
    if isinstance(codec, DictionaryCodec) and codec.uses_dictionary:
        return codec
    return None


@dataclass(frozen=True)
class _NamespaceDictionaries:
    """The dictionaries of one namespace, by digest (a ``seqkv.codec.DictionarySource``)."""

    lookup: Callable[[str], Dictionary | None]

    def get(self, digest: str) -> Dictionary | None:
        return self.lookup(digest)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class SessionStore:
    """Put, get, append and delete sessions; every call names its namespace."""

    def __init__(self, backend: StoreBackend, codecs: CodecFactory, *,
                 spacing: IndexSpacing | None = None, hot_bytes: int = DEFAULT_HOT_BYTES,
                 max_candidates: int = 3) -> None:
        self._backend = backend
        self._codecs = codecs
        self._spacing = spacing or IndexSpacing()
        self._hot = HotTier(hot_bytes)
        self._max_candidates = max_candidates
        self._by_index: dict[int, SessionCodec] = {}
        self._dictionaries: OrderedDict[tuple[NamespaceKey, str], Dictionary] = OrderedDict()
        self._dictionary_bytes = 0

    @classmethod
    def directory(cls, path: str | os.PathLike[str], model: CausalLM, *,
                  tolerance: float = DEFAULT_TOLERANCE, spacing: IndexSpacing | None = None,
                  hot_bytes: int = DEFAULT_HOT_BYTES) -> SessionStore:
        """A store in a local directory, coding with ``model``."""
        from seqkv.store.directory import DirectoryBackend

        return cls(DirectoryBackend(path), skv_codecs(model, tolerance), spacing=spacing,
                   hot_bytes=hot_bytes)

    @classmethod
    def redis(cls, url: str, model: CausalLM, *, tolerance: float = DEFAULT_TOLERANCE,
              prefix: str = "skv", spacing: IndexSpacing | None = None,
              hot_bytes: int = DEFAULT_HOT_BYTES) -> SessionStore:
        """A store on the Redis server at ``url``, coding with ``model``."""
        from seqkv.store.redis_backend import RedisBackend

        return cls(RedisBackend(url, prefix), skv_codecs(model, tolerance), spacing=spacing,
                   hot_bytes=hot_bytes)

    @property
    def backend(self) -> StoreBackend:
        return self._backend

    @property
    def hot(self) -> HotTier:
        return self._hot

    def close(self) -> None:
        self._backend.close()

    def _codec_for_level(self, level: str) -> tuple[SessionCodec, int]:
        codec = self._codecs(level)
        index = self._backend.register_codec(codec.identity())
        self._by_index[index] = codec
        return codec, index

    def _codec_for_index(self, index: int) -> SessionCodec:
        if index not in self._by_index:
            identity = self._backend.codec(index)
            codec = self._codecs(identity.level)
            if codec.identity().digest != identity.digest:
                raise CodecMismatchError(
                    f"a stored span was coded by {identity.description}; this worker's codec "
                    f"for level {identity.level!r} is {codec.identity().description}: decode on "
                    "a worker with the same model, execution profile and tolerance"
                )
            self._by_index[index] = codec
        return self._by_index[index]

    def _key(self, ns: NamespaceKey, span: SpanId) -> HotKey:
        return (self._backend.store_id(), ns, span)

    def _not_found(self, name: SessionName, namespace: StoreNamespace) -> SessionNotFoundError:
        return SessionNotFoundError(
            f"no session {name!r} in namespace {namespace!r}: check the id and the namespace, "
            "or put the session first"
        )

    def _decode_chains(self, ns: NamespaceKey, ns_name: StoreNamespace,
                       chains: Sequence[tuple[StoredSpan, ...]]) -> dict[SpanId, ChainState]:
        """The chain state of every span in ``chains``' leaves (and what decoding them needed)."""
        states: dict[SpanId, ChainState] = {}
        need: dict[SpanId, StoredSpan] = {}
        parents: dict[SpanId, SpanId | None] = {}  # what the backend's chain says
        for chain in chains:
            for position in range(len(chain) - 1, -1, -1):
                stored = chain[position]
                if stored.span in states or stored.span in need:
                    break
                hot = self._hot.get(self._key(ns, stored.span))
                if hot is not None:
                    states[stored.span] = hot
                    break
                need[stored.span] = stored
                parents[stored.span] = chain[position - 1].span if position else None
        records = {span: unpack(stored.record) for span, stored in need.items()}
        for span, record in records.items():
            if record.parent != parents[span]:
                raise CorruptRecordError(
                    f"span {span}'s record names parent {record.parent}, the store's chain "
                    f"{parents[span]}: the record or the store's metadata was damaged")
        while need:
            ready = [span for span in need
                     if records[span].parent is None or records[span].parent in states]
            assert ready, "a span's parent is neither decoded nor pending"
            groups: dict[int, list[SpanId]] = {}
            for span in ready:
                groups.setdefault(records[span].codec, []).append(span)
            for index, spans in groups.items():
                codec = self._codec_for_index(index)
                prefixes = [self._prefix_of(records[s], states) for s in spans]
                decoded = self._decode(ns, ns_name, codec, [
                    (records[s].payload, p) for s, p in zip(spans, prefixes, strict=True)])
                for span, prefix, result in zip(spans, prefixes, decoded, strict=True):
                    record = records[span]
                    parent = None if record.parent is None else states[record.parent]
                    state = ChainState(
                        (prefix.tokens if prefix else ()) + tuple(result.tokens), result.kv,
                        record.kv_exact and result.kv_exact
                        and (parent is None or parent.kv_exact),
                        (parent.spans_until(record.start) if parent else ())
                        + ((span, record.start),))
                    states[span] = state
                    self._hot.put(self._key(ns, span), state)
                    del need[span]
        return states

    def _decode(self, ns: NamespaceKey, ns_name: StoreNamespace, codec: SessionCodec,
                items: list[tuple[bytes, PrefixState | None]]) -> list[DecodedSpan]:
        mixing = _mixes(codec)
        if mixing is None:
            return codec.decode_many(items)
        return mixing.decode_many_with_dictionaries(
            items, _NamespaceDictionaries(lambda digest: self._dictionary(ns, ns_name, digest)))

    def _encode(self, ns: NamespaceKey, ns_name: StoreNamespace, codec: SessionCodec,
                tokens: list[int], target: torch.Tensor | None, prefix: PrefixState | None
                ) -> tuple[EncodedSpan, DictionaryDigest | None]:
        """Code a span; at a mixing level, with the namespace's current dictionary."""
        mixing = _mixes(codec)
        if mixing is None:
            return codec.encode(tokens, target, prefix), None
        current = self._backend.current_dictionary(ns)
        if current is None:
            raise DictionaryUnavailableError(
                f"namespace {ns_name!r} holds no mixing dictionary: put one first "
                f"(SessionStore.put_dictionary; CLI: seqkv store dict-put DICT --namespace "
                f"{ns_name}), or store at a level that does not mix, such as "
                f"{DEFAULT_STORE_LEVEL}")
        dictionary = self._dictionary(ns, ns_name, current)
        if dictionary is None:
            raise missing_dictionary(current)
        encoded = mixing.encode_with_dictionary(tokens, target, prefix, dictionary)
        assert mixing.payload_dictionary(encoded.payload) == dictionary.digest
        return encoded, dictionary.digest

    def _dictionary(self, ns: NamespaceKey, ns_name: StoreNamespace,
                    digest: str) -> Dictionary | None:
        """The dictionary ``ns`` stores under ``digest`` (cached), or None; checked against the
        digest and the namespace."""
        key = (ns, digest)
        cached = self._dictionaries.get(key)
        if cached is not None:
            self._dictionaries.move_to_end(key)
            return cached
        data = self._backend.fetch_dictionary(ns, digest)
        if data is None:
            return None
        dictionary = Dictionary.from_bytes(data, expected=DictionaryDigest(digest))
        if dictionary.namespace != ns_name:
            raise CorruptDictionaryError(
                f"namespace {ns_name!r} stores the dictionary {digest[:16]}... of namespace "
                f"{dictionary.namespace!r}: the store was altered outside seqkv")
        if dictionary.size_bytes <= DEFAULT_DICTIONARY_CACHE_BYTES:
            self._dictionaries[key] = dictionary
            self._dictionary_bytes += dictionary.size_bytes
            while self._dictionary_bytes > DEFAULT_DICTIONARY_CACHE_BYTES:
                _, evicted = self._dictionaries.popitem(last=False)
                self._dictionary_bytes -= evicted.size_bytes
        return dictionary

    def put_dictionary(self, dictionary: Dictionary, *, namespace: str) -> StoredDictionary:
        """Store ``dictionary`` in ``namespace`` (content-addressed by its digest) and make it
        the namespace's current one: later puts and appends at ``portable+mix`` code with it.

        The dictionary must have been built for this namespace (``build_dictionary(...,
        namespace=...)``, CLI ``seqkv dict build --namespace``): its namespace is part of its
        digest, so two tenants' dictionaries never share one. Spans coded with an earlier
        dictionary keep decoding with it; ``gc`` removes a dictionary only once no session
        needs it and it is not current.
        """
        ns_name = check_namespace(namespace)
        if dictionary.namespace != ns_name:
            raise DictionaryNamespaceError(
                f"the dictionary {str(dictionary.digest)[:16]}... was built for namespace "
                f"{dictionary.namespace!r}, not {ns_name!r}: build it for this namespace "
                f"(seqkv dict build --namespace {ns_name})")
        ns = namespace_key(ns_name)
        created = self._backend.put_dictionary(ns, str(dictionary.digest), dictionary.to_bytes())
        return StoredDictionary(dictionary.digest, ns_name, len(dictionary),
                                dictionary.size_bytes, created)

    def current_dictionary(self, *, namespace: str) -> Dictionary | None:
        """The namespace's current dictionary (None: none was put)."""
        ns_name = check_namespace(namespace)
        ns = namespace_key(ns_name)
        current = self._backend.current_dictionary(ns)
        if current is None:
            return None
        dictionary = self._dictionary(ns, ns_name, current)
        if dictionary is None:
            raise missing_dictionary(current)
        return dictionary

    def dictionaries(self, *, namespace: str) -> list[DictionaryDigest]:
        """The digests of the dictionaries the namespace stores, sorted."""
        ns = namespace_key(check_namespace(namespace))
        return [DictionaryDigest(d) for d in self._backend.dictionary_digests(ns)]

    @staticmethod
    def _prefix_of(record: SpanRecord, states: dict[SpanId, ChainState]) -> PrefixState | None:
        if record.parent is None:
            return None
        parent = states[record.parent]
        kv = None if parent.kv is None else parent.kv[:, :, :, : record.start]
        return PrefixState(parent.tokens[: record.start], kv)

    def _chain_state(self, ns: NamespaceKey, ns_name: StoreNamespace,
                     span: SpanId) -> ChainState | None:
        hot = self._hot.get(self._key(ns, span))
        if hot is not None:
            return hot
        chain = self._backend.fetch_chain(ns, span)
        if chain is None:
            return None
        return self._decode_chains(ns, ns_name, [chain])[span]

    def _match(self, ns: NamespaceKey, ns_name: StoreNamespace, tokens: list[int],
               target: torch.Tensor | None,
               codec: SessionCodec, positions: list[int], keys: list[bytes],
               hits: list[SpanId | None]) -> _Match:
        candidates: list[tuple[int, SpanId]] = []
        for position, span in reversed(list(zip(positions, hits, strict=True))):
            if span is not None and all(span != s for _, s in candidates):
                candidates.append((position, span))
        best = _Match(0, None, 0)
        tried = 0
        for position, span in candidates[: self._max_candidates]:
            tried += 1
            state = self._chain_state(ns, ns_name, span)
            if state is None or (state.kv is not None) != codec.uses_kv:
                continue
            length = _common_prefix(state.tokens, tokens)
            if target is not None and state.kv is not None and length > 0:
                error = (target[:, :, :, :length] - state.kv[:, :, :, :length]).abs().max()
                if float(error) > codec.max_prefix_error:
                    continue
            if length > best.length:
                best = _Match(length, state, tried)
            if length >= position:
                break
        return _Match(best.length, best.state, tried)

    def find_prefix(self, tokens: Sequence[int], *, level: str = DEFAULT_STORE_LEVEL,
                    namespace: str) -> PrefixMatch:
        """How many leading ``tokens`` a ``put`` at ``level`` would find stored; stores nothing.

        One index request, then at most ``max_candidates`` chains fetched (each one request) or
        found hot.
        """
        ns_name = check_namespace(namespace)
        ns = namespace_key(ns_name)
        token_list = [int(t) for t in tokens]
        codec, _ = self._codec_for_level(level)
        started = self._backend.round_trips
        positions = self._spacing.positions(len(token_list))
        keys = chain_keys(ns, token_list, positions, self._spacing.key_bytes)
        hits = self._backend.lookup(ns, keys)
        match = self._match(ns, ns_name, token_list, None, codec, positions, keys, hits)
        return PrefixMatch(match.length, match.candidates, self._backend.round_trips - started)

    def put(self, session_id: str, tokens: Sequence[int],
            kv: DynamicCache | torch.Tensor | None = None, *,
            level: str = DEFAULT_STORE_LEVEL, namespace: str) -> PutResult:
        """Store a new session; its longest stored prefix is referenced, not coded again.

        ``level`` defaults to ``portable``; at ``portable+mix`` the namespace's current
        dictionary codes it (``put_dictionary``). Raises ``SessionExistsError`` if the
        namespace already holds ``session_id``.
        """
        name = check_session_id(session_id)
        ns_name = check_namespace(namespace)
        ns = namespace_key(ns_name)
        token_list = [int(t) for t in tokens]
        if not token_list:
            raise EmptyInputError("a session needs at least one token")
        target = _kv_tensor(kv)
        if target is not None and target.shape[3] != len(token_list):
            raise InvalidKVError(f"the KV holds {target.shape[3]} tokens, the session "
                                 f"{len(token_list)}: pass the KV of exactly these tokens")
        codec, index = self._codec_for_level(level)
        started = self._backend.round_trips
        positions = self._spacing.positions(len(token_list))
        keys = chain_keys(ns, token_list, positions, self._spacing.key_bytes)
        for _ in range(_RETRIES):
            hits = self._backend.lookup(ns, keys)
            match = self._match(ns, ns_name, token_list, target, codec, positions, keys, hits)
            index_keys = tuple(k for p, k, h in zip(positions, keys, hits, strict=True)
                               if p > match.length or h is None)
            try:
                return self._code_and_commit(ns, name, ns_name, token_list, target, codec, index,
                                             match, index_keys, None, started)
            except ParentGoneError:
                # The matched chain was deleted after it was decoded (or found hot).
                for span, _ in match.state.spans if match.state is not None else ():
                    self._hot.discard(self._key(ns, span))
                continue
            except DictionaryGoneError:
                # gc removed the dictionary after another put_dictionary replaced it as current.
                continue
        raise ConcurrentUpdateError(
            f"session {name!r}: the prefix or dictionary it was coded with kept being deleted; "
            "retry")

    def _code_and_commit(self, ns: NamespaceKey, name: SessionName, ns_name: StoreNamespace,
                         tokens: list[int], target: torch.Tensor | None, codec: SessionCodec,
                         index: int, match: _Match, index_keys: tuple[bytes, ...],
                         expect: SessionEntry | None, started: int) -> PutResult:
        length = match.length
        state = match.state
        if state is not None and length == len(tokens):
            span = state.span_at(length - 1)
            plan = CommitPlan(name, len(tokens), expect, None, span, ())
            self._commit(ns, plan, ns_name)
            return PutResult(name, len(tokens), length, 0, span, 0, 0, 0, match.candidates,
                             self._backend.round_trips - started)
        prefix = None
        exact_prefix = True
        if state is not None and length > 0:
            prefix_kv = None if state.kv is None else state.kv[:, :, :, :length]
            prefix = PrefixState(tuple(tokens[:length]), prefix_kv)
            if target is not None and prefix_kv is not None:
                exact_prefix = bool(torch.equal(target[:, :, :, :length], prefix_kv))
                target = torch.cat([prefix_kv, target[:, :, :, length:]], dim=3)
            exact_prefix = exact_prefix and state.kv_exact
        encoded, dictionary = self._encode(ns, ns_name, codec, tokens, target, prefix)
        parent = None if prefix is None or state is None else state.span_at(length - 1)
        record = pack(SpanRecord(index, parent, length if parent is not None else 0,
                                 encoded.kv_exact and exact_prefix, encoded.payload))
        plan = CommitPlan(name, len(tokens), expect, record, parent, index_keys, dictionary)
        span = self._commit(ns, plan, ns_name)
        spans = (state.spans_until(length) if parent is not None and state else ())
        if encoded.kv is not None or not codec.uses_kv:
            self._hot.put(self._key(ns, span), ChainState(
                tuple(tokens), encoded.kv, encoded.kv_exact and exact_prefix,
                (*spans, (span, length if parent is not None else 0))))
        return PutResult(name, len(tokens), length if parent is not None else 0,
                         len(tokens) - (length if parent is not None else 0), span, len(record),
                         encoded.coded_bytes, encoded.container_bytes, match.candidates,
                         self._backend.round_trips - started)

    def _commit(self, ns: NamespaceKey, plan: CommitPlan, ns_name: StoreNamespace) -> SpanId:
        try:
            return self._backend.commit(ns, plan)
        except SessionExistsError:
            raise SessionExistsError(
                f"namespace {ns_name!r} already holds session {plan.session!r}: delete it "
                "first, or append to it") from None
        except ConcurrentUpdateError:
            raise ConcurrentUpdateError(
                f"session {plan.session!r} changed while this call coded it (another writer "
                "appended or deleted): read it again and retry") from None

    def append(self, session_id: str, new_tokens: Sequence[int],
               new_kv: DynamicCache | torch.Tensor | None = None, *,
               namespace: str) -> PutResult:
        """Code only ``new_tokens``, against the stored session, and extend the session.

        ``new_kv`` is the KV of the new tokens alone, or of the whole extended session.
        """
        name = check_session_id(session_id)
        ns_name = check_namespace(namespace)
        ns = namespace_key(ns_name)
        added = [int(t) for t in new_tokens]
        if not added:
            raise EmptyInputError("append needs at least one new token")
        started = self._backend.round_trips
        (found,) = self._backend.fetch_sessions(ns, [name])
        if found is None:
            raise self._not_found(name, ns_name)
        entry = found.entry
        state = self._decode_chains(ns, ns_name, [found.chain])[entry.span]
        leaf = unpack(found.chain[-1].record)
        codec = self._codec_for_index(leaf.codec)
        tokens = list(state.tokens[: entry.length]) + added
        target = _kv_tensor(new_kv)
        if target is not None:
            if target.shape[3] == len(added) and state.kv is not None:
                target = torch.cat([state.kv[:, :, :, : entry.length], target], dim=3)
            elif target.shape[3] != len(tokens):
                raise InvalidKVError(
                    f"new_kv holds {target.shape[3]} tokens: pass the KV of the {len(added)} "
                    f"new tokens or of all {len(tokens)} tokens of the extended session")
        positions = self._spacing.positions(len(tokens), after=entry.length)
        keys = chain_keys(ns, tokens, positions, self._spacing.key_bytes)
        match = _Match(entry.length, state, 0)
        if target is not None and state.kv is not None:
            error = (target[:, :, :, : entry.length] - state.kv[:, :, :, : entry.length]).abs()
            if float(error.max()) > codec.max_prefix_error:
                raise InvalidKVError(
                    "new_kv differs from the stored session's KV over the stored tokens by "
                    f"{float(error.max()):.3g}, more than the tolerance "
                    f"{codec.max_prefix_error}: pass the KV of the new tokens alone")
        try:
            return self._code_and_commit(ns, name, ns_name, tokens, target, codec,
                                         leaf.codec, match, tuple(keys), entry, started)
        except ParentGoneError:
            raise self._not_found(name, ns_name) from None
        except DictionaryGoneError:
            raise ConcurrentUpdateError(
                f"session {name!r}: the namespace's dictionary was replaced and removed while "
                "this call coded with it; retry") from None

    def get(self, session_id: str, *, namespace: str) -> StoredSession:
        """The session's tokens and KV, decoded and checked."""
        return self.get_many([session_id], namespace=namespace)[0]

    def get_many(self, session_ids: Sequence[str], *, namespace: str) -> list[StoredSession]:
        """Many sessions of one namespace, decoded together (shared forwards where possible)."""
        names = [check_session_id(s) for s in session_ids]
        ns_name = check_namespace(namespace)
        ns = namespace_key(ns_name)
        found = self._backend.fetch_sessions(ns, names)
        chains: list[SessionChain] = []
        for name, item in zip(names, found, strict=True):
            if item is None:
                raise self._not_found(name, ns_name)
            chains.append(item)
        states = self._decode_chains(ns, ns_name, [c.chain for c in chains])
        out = []
        for name, chain in zip(names, chains, strict=True):
            state = states[chain.entry.span]
            length = chain.entry.length
            kv = None if state.kv is None else state.kv[:, :, :, :length].contiguous()
            out.append(StoredSession(name, ns_name, list(state.tokens[:length]),
                                     None if kv is None else cache_from_tensor(kv), kv,
                                     state.kv_exact))
        return out

    def delete(self, session_id: str, *, namespace: str) -> None:
        """Remove a session; spans no other session needs go with it."""
        name = check_session_id(session_id)
        ns_name = check_namespace(namespace)
        if not self._backend.delete(namespace_key(ns_name), name):
            raise self._not_found(name, ns_name)

    def list(self, *, namespace: str) -> list[SessionName]:
        """The namespace's session ids, sorted."""
        return self._backend.names(namespace_key(check_namespace(namespace)))

    def stat(self, session_id: str, *, namespace: str) -> SessionStat:
        """A session's size: tokens, bytes of its chain, and how many of them are shared."""
        name = check_session_id(session_id)
        ns_name = check_namespace(namespace)
        ns = namespace_key(ns_name)
        (found,) = self._backend.fetch_sessions(ns, [name])
        if found is None:
            raise self._not_found(name, ns_name)
        counts = self._backend.refcounts(ns, [s.span for s in found.chain])
        sizes = [len(s.record) for s in found.chain]
        exact = all(unpack(s.record).kv_exact for s in found.chain)
        return SessionStat(name, found.entry.length, len(sizes), sum(sizes),
                           sum(n for n, c in zip(sizes, counts, strict=True) if c > 1), exact)

    def gc(self, *, namespace: str) -> GcReport:
        """Remove garbage of crashed writers; repair counts that differ from a recount; remove
        the namespace's dictionaries that no stored session needs and that are not current."""
        return self._backend.gc(namespace_key(check_namespace(namespace)))

    def audit(self, *, namespace: str) -> AuditReport:
        """Recount the namespace's references and compare them with the stored counts."""
        return self._backend.audit(namespace_key(check_namespace(namespace)))

    def byte_counts(self, *, namespace: str) -> ByteCounts:
        return self._backend.byte_counts(namespace_key(check_namespace(namespace)))

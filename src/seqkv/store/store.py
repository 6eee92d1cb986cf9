"""``SessionStore``: sessions' KV stored once across a fleet, on a directory or on Redis.

Motivation: one ``.skv`` file per session repeats its model identity and profile digests and
every shared prefix. The store keeps each codec identity once, each shared prefix once (as a
span that every session extending it references), and per span only a small record of its coded
session (``seqkv.formats.span``). A session is a chain of spans: put codes the tokens after the
longest stored prefix, append codes only the new turn against the stored session.

A put: find the longest prefix this worker's prefix trie holds (``seqkv.store.hot``); unless
it covers the session, look up the new session's index keys in one request and verify the
deepest candidates' tokens (``seqkv.store.prefixes``); code the rest against the longest match
(``seqkv.store.codec``), and commit the new span, its index entries, the counts and the session
entry in one atomic backend call. A get: fetch every asked session's chain in one request and
decode the spans the trie does not hold, parents first (``seqkv.store.chains``). This module
composes those parts; each is one concern: prefixes, chains, dictionaries
(``seqkv.store.dictionaries``), codecs (``seqkv.store.registry``), backends
(``seqkv.store.backends``).

Invariants:
1. A span's prefix state is exactly what a decoder rebuilds (``seqkv.store.chains``,
   invariant 1); a session is coded only against a verified prefix (``seqkv.store.prefixes``).
2. Namespaces are disjoint: every backend key and index hash is derived from the namespace, and a
   session missing from the asked namespace raises ``SessionNotFoundError`` with the message a
   never-stored id gets, after the same single request (enforced).
3. Reference counts change only inside backend commits (``seqkv.store.backends.base``).
4. Nothing is committed that failed a bound: the codec's (``seqkv.store.codec`` invariant 4)
   and that the span record's bytes add up (enforced in ``_record``).
5. Each namespace keeps its own mixing dictionaries (``seqkv.store.dictionaries``); a put at a
   level that mixes codes with the namespace's current one.
6. A get returns a session only once its row was checked against what its chain decoded: the
   row's span holds the session's last token, and its binding (``seqkv.store.binding``) equals
   the one of the decoded tokens and of the KV digest of its span's record; else
   ``CorruptRecordError`` naming the session (enforced in ``_check_row``; a row of schema 1 has
   no binding and gets the first check only, and reads at all only while the legacy list holds
   it as it is: ``seqkv.store.binding`` invariant 2). Every put and append records the binding.
   ``stat`` decodes nothing and checks the same without the decode: the length against its
   span's record, and the binding where the row ends at its span's last token (enforced in
   ``stat``; it says which by ``SessionStat.binding_checked``).
7. A session, or a span of its chain, claiming more tokens than the caller's ``max_tokens``
   (default: its codec's context) is refused before any forward (enforced: ``_limit`` and
   ``seqkv.store.chains`` invariant 4).

The default level is ``portable``: its tokens decode on any machine with the model's weights;
the KV is exact on the encoder's execution profile.

What mutates: ``put``/``append``/``delete``/``gc``/``put_dictionary`` change the backend;
``put``, ``append``, ``get`` and ``get_many`` also insert into this process's prefix trie (a put
locks the path it matched there until it commits), and reads of dictionaries fill this
process's dictionary cache.

Limits: a ``SessionStore`` object serves one thread (its hot tier takes no thread lock); open
one per thread or process, all on the same backend. Two writers that code the same new prefix
at the same moment both store it (each finds nothing in the index); later sessions reference
the one the index names first (or the one a worker's trie holds), as with vLLM's concurrently
computed blocks.
"""

from __future__ import annotations

import builtins
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from seqkv.bounds import file_bytes_accounted, raise_unless_all_hold
from seqkv.codec import DEFAULT_TOLERANCE, Theorem1
from seqkv.digests import Digest, tokens_digest
from seqkv.errors import (
    EmptyInputError,
    InvalidArgumentTypeError,
    InvalidKVError,
    InvalidTokensError,
    SeqKVError,
)
from seqkv.formats.span import SpanRecord, span_parts, write_span
from seqkv.kvcache import cache_from_tensor, tensor_from_cache
from seqkv.mixing.dictionary import Dictionary, DictionaryDigest
from seqkv.models.adapter import CausalLM
from seqkv.session import Prefix
from seqkv.store.backends.base import (
    AuditReport,
    ByteCounts,
    CommitPlan,
    DictionaryGoneError,
    GcReport,
    ParentGoneError,
    SessionChain,
    SessionEntry,
    StoreBackend,
    is_int,
)
from seqkv.store.binding import Binding, digest_binding, session_binding
from seqkv.store.chains import ChainDecoder, SpanRecords
from seqkv.store.codec import EncodedSpan, SpanCodec
from seqkv.store.codecs import DEFAULT_STORE_LEVEL
from seqkv.store.dictionaries import NamespaceDictionaries, StoredDictionary
from seqkv.store.errors import (
    ConcurrentUpdateError,
    CorruptRecordError,
    InvalidSessionIdError,
    SessionExistsError,
    SessionNotFoundError,
    SessionTooLongError,
)
from seqkv.store.hot import ChainState, HotTier, inexact_until
from seqkv.store.ids import SessionName, SpanId, StoreNamespace, Tenant, check_session_id
from seqkv.store.index import IndexSpacing
from seqkv.store.pins import PIN_PREFIX, StorePrefixSource, pin_name
from seqkv.store.prefixes import Match, PrefixMatcher
from seqkv.store.registry import CodecFactory, CodecRegistry, model_codecs
from seqkv.trie.keys import Namespace, prefix_hash

# NOTE: 256 MiB holds the decoded KV of ~11,000 SmolLM2-135M tokens (23,040 float32 bytes each).
DEFAULT_HOT_BYTES = 256 << 20
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
    candidates: int  # index candidates decoded or found hot
    round_trips: int
    # Theorem 1 over the coded tokens, exact (None: nothing coded, or model-free tables)
    theorem1: Theorem1 | None = None


@dataclass(frozen=True, slots=True)
class SessionStat:
    session: SessionName
    tokens: int
    spans: int
    bytes: int  # records of the session's whole chain
    shared_prefix_bytes: int  # of which in spans that other sessions or spans also reference
    kv_exact: bool
    # the row's binding was compared (it ends at its span's last token); else only a get checks
    # it (``SessionStore.stat``)
    binding_checked: bool = False


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The longest stored prefix of some tokens, verified token by token."""

    length: int
    candidates: int  # index candidates decoded or found hot
    round_trips: int


@dataclass(frozen=True, slots=True)
class DamagedSession:
    """A session a deep audit could not read: its id and the error it ended in."""

    session: str
    error: str  # the error's class
    message: str


@dataclass(frozen=True, slots=True)
class DeepAuditReport:
    """A recount (``AuditReport``) and every session of the namespace decoded and checked."""

    audit: AuditReport
    sessions: int  # decoded or tried
    damaged: tuple[DamagedSession, ...]  # ended in a ``SeqKVError``
    unbound: tuple[str, ...]  # read, but their rows carry no binding (schema 1)

    @property
    def consistent(self) -> bool:
        return self.audit.consistent and not self.damaged


@dataclass(frozen=True)
class _Coding:
    """One session to code and commit: what it is, against what, and how to commit it."""

    tenant: Tenant
    name: SessionName
    tokens: list[int]
    target: torch.Tensor | None  # the caller's KV of every token, or None
    codec: SpanCodec
    index: int  # the codec's index in the store
    match: Match
    index_keys: tuple[bytes, ...]
    expect: SessionEntry | None  # the entry an append found (None: a new session)
    started: int  # round trips before the call


def _kv_tensor(kv: DynamicCache | torch.Tensor | None) -> torch.Tensor | None:
    if kv is None:
        return None
    tensor = tensor_from_cache(kv) if isinstance(kv, DynamicCache) else kv
    if tensor.dim() != 5 or tensor.shape[1] != 2:
        raise InvalidKVError(f"expected a [layers, 2, heads, tokens, dim] KV, got {tensor.shape}")
    return tensor.detach().to("cpu", torch.float32)


def _record(encoded: EncodedSpan, index: int, parent: SpanId | None, start: int,
            kv_exact: bool) -> bytes:
    """The span record of ``encoded``, its bytes checked against its parts (invariant 4)."""
    session = encoded.session
    record = SpanRecord(index, parent, start, kv_exact, session.count, session.tokens_digest,
                        session.kv_digest, session.dictionary, session.residual,
                        session.token_code)
    data = write_span(record)
    raise_unless_all_hold((*encoded.bounds, file_bytes_accounted(len(data), span_parts(record))))
    return data


class SessionStore:
    """Put, get, append and delete sessions; every call names its namespace."""

    def __init__(self, backend: StoreBackend, codecs: CodecFactory, *,
                 spacing: IndexSpacing | None = None, hot_bytes: int = DEFAULT_HOT_BYTES,
                 max_candidates: int = 3) -> None:
        self._backend = backend
        self._registry = CodecRegistry(backend, codecs)
        self._hot = HotTier(hot_bytes)
        self._dictionaries = NamespaceDictionaries(backend)
        self._chains = ChainDecoder(backend, self._registry, self._hot, self._dictionaries)
        self._prefixes = PrefixMatcher(backend, self._chains, self._hot,
                                       spacing or IndexSpacing(), max_candidates)

    @classmethod
    def directory(cls, path: str | os.PathLike[str], model: CausalLM, *,
                  tolerance: float = DEFAULT_TOLERANCE, spacing: IndexSpacing | None = None,
                  hot_bytes: int = DEFAULT_HOT_BYTES) -> SessionStore:
        """A store in a local directory, coding with ``model``."""
        from seqkv.store.backends.directory import DirectoryBackend

        return cls(DirectoryBackend(path), model_codecs(model, tolerance), spacing=spacing,
                   hot_bytes=hot_bytes)

    @classmethod
    def redis(cls, url: str, model: CausalLM, *, tolerance: float = DEFAULT_TOLERANCE,
              prefix: str = "skv", spacing: IndexSpacing | None = None,
              hot_bytes: int = DEFAULT_HOT_BYTES) -> SessionStore:
        """A store on the Redis server at ``url``, coding with ``model``."""
        from seqkv.store.backends.redis import RedisBackend

        return cls(RedisBackend(url, prefix), model_codecs(model, tolerance), spacing=spacing,
                   hot_bytes=hot_bytes)

    @property
    def backend(self) -> StoreBackend:
        return self._backend

    @property
    def hot(self) -> HotTier:
        return self._hot

    def close(self) -> None:
        self._backend.close()

    def _not_found(self, name: SessionName, tenant: Tenant) -> SessionNotFoundError:
        return SessionNotFoundError(
            f"no session {name!r} in namespace {tenant.name!r}: check the id and the "
            "namespace, or put the session first")

    def find_prefix(self, tokens: Sequence[int], *, level: str = DEFAULT_STORE_LEVEL,
                    namespace: str) -> PrefixMatch:
        """How many leading ``tokens`` a ``put`` at ``level`` would find stored; stores nothing.

        None when this worker's prefix trie holds every token; else one index request, then at
        most ``max_candidates`` chains fetched (each one request) or found in the trie.
        """
        tenant = Tenant.of(namespace)
        token_list = [int(t) for t in tokens]
        codec, _ = self._registry.for_level(level)
        started = self._backend.round_trips
        match, _ = self._prefixes.find(tenant, token_list, None, codec, lock=False)
        return PrefixMatch(match.length, match.candidates, self._backend.round_trips - started)

    def pin_prefix(self, session_id: str, length: int, *, namespace: str) -> Prefix:
        """The first ``length`` tokens of a stored session and their KV, as the prefix a
        ``.skv`` file is coded against (``seqkv.compress(..., prefix=...)``), pinned in the
        store under its content hash (``seqkv.store.pins``): ``prefix_source(namespace=...)``
        resolves it for ``decompress``. Pinning the same prefix again returns it."""
        tenant = Tenant.of(namespace)
        if not is_int(length) or not length >= 1:
            raise InvalidTokensError(f"length is {length!r}: pass a positive number of tokens")
        stored = self.get(session_id, namespace=namespace)
        if length > len(stored.tokens):
            raise InvalidTokensError(
                f"session {session_id!r} holds {len(stored.tokens):,} tokens, fewer than the "
                f"{length:,} asked: pin a prefix of the session")
        tokens = tuple(stored.tokens[:length])
        kv = None if stored.kv is None else stored.kv[:, :, :, :length].contiguous()
        hash_ = prefix_hash(Namespace(tenant.name), tokens)
        (found,) = self._backend.fetch_sessions(tenant.key, [pin_name(hash_)])
        if found is None:
            try:
                self.put(pin_name(hash_), tokens, kv, level=self._level_of(tenant, session_id),
                         namespace=namespace)
                return Prefix(tokens, kv, hash_)
            except SessionExistsError:
                pass  # another worker pinned it between the two calls
        # NOTE: a pin made before (from another session, or at another level) holds its own KV
        # bits: a file coded against them is what ``prefix_source`` resolves
        return self.prefix_source(namespace=namespace).resolve(hash_)

    def prefix_source(self, *, namespace: str) -> StorePrefixSource:
        """The ``seqkv.skv.PrefixSource`` of ``namespace``: ``decompress(...,
        prefixes=store.prefix_source(namespace=...))`` finds prefixes ``pin_prefix`` pinned."""
        tenant = Tenant.of(namespace)

        def read(name: SessionName) -> tuple[tuple[int, ...], Prefix]:
            stored = self.get(name, namespace=namespace)
            return tuple(stored.tokens), Prefix(tuple(stored.tokens), stored.kv)

        return StorePrefixSource(Namespace(tenant.name), read)

    def _level_of(self, tenant: Tenant, session_id: str) -> str:
        """The level of the codec that coded a stored session's last span."""
        (found,) = self._backend.fetch_sessions(tenant.key, [check_session_id(session_id)])
        if found is None or not found.chain:
            raise self._not_found(check_session_id(session_id), tenant)
        return self._chains.records().get(found.chain[-1]).codec.identity().level

    def put(self, session_id: str, tokens: Sequence[int],
            kv: DynamicCache | torch.Tensor | None = None, *,
            level: str = DEFAULT_STORE_LEVEL, namespace: str) -> PutResult:
        """Store a new session; its longest stored prefix is referenced, not coded again.

        ``level`` defaults to ``portable``; at ``portable+mix`` the namespace's current
        dictionary codes it (``put_dictionary``). Raises ``SessionExistsError`` if the
        namespace already holds ``session_id``.
        """
        name = check_session_id(session_id)
        tenant = Tenant.of(namespace)
        token_list = [int(t) for t in tokens]
        if not token_list:
            raise EmptyInputError("a session needs at least one token")
        _check_pin_name(name, tenant, token_list)
        target = _kv_tensor(kv)
        if target is not None and target.shape[3] != len(token_list):
            raise InvalidKVError(f"the KV holds {target.shape[3]} tokens, the session "
                                 f"{len(token_list)}: pass the KV of exactly these tokens")
        codec, index = self._registry.for_level(level)
        started = self._backend.round_trips
        for _ in range(_RETRIES):
            match, lookup = self._prefixes.find(tenant, token_list, target, codec, lock=True)
            keys = () if lookup is None else lookup.keys_after(match.length)
            coding = _Coding(tenant, name, token_list, target, codec, index, match, keys, None,
                             started)
            try:
                return self._code_and_commit(coding)
            except ParentGoneError:
                # The matched chain was deleted (by another worker) after it was decoded or
                # found in the trie: the trie forgets every chain through its spans.
                gone = {span for span, _ in (match.state.spans if match.state else ())}
                if match.node is not None:
                    self._hot.unlock(match.node)
                    match = dataclasses.replace(match, node=None)
                self._hot.discard(self._chains.root(tenant), gone.__contains__)
            except DictionaryGoneError:
                pass  # gc removed the dictionary after another put_dictionary replaced it
            finally:
                if match.node is not None:
                    self._hot.unlock(match.node)
        raise ConcurrentUpdateError(
            f"session {name!r}: the prefix or dictionary it was coded with kept being deleted; "
            "retry")

    def _code_and_commit(self, coding: _Coding) -> PutResult:
        length, state = coding.match.length, coding.match.state
        tokens = coding.tokens
        if state is not None and length == len(tokens):
            span = state.span_at(length - 1)
            # NOTE: the row binds its span's KV digest, which only the span's record holds.
            chain = self._backend.fetch_chain(coding.tenant.key, span)
            if chain is None:
                raise ParentGoneError(span)
            self._commit(coding, CommitPlan(coding.name, len(tokens), coding.expect, None,
                                            span, ()),
                         self._chains.read(chain[-1]).record.kv_digest)
            return PutResult(coding.name, len(tokens), length, 0, span, 0, 0,
                             coding.match.candidates,
                             self._backend.round_trips - coding.started)
        parent = state.span_at(length - 1) if state is not None and length > 0 else None
        start = length if parent is not None else 0
        prefix = state.prefix(start) if state is not None and parent is not None else None
        target, exact_prefix = coding.target, True
        if prefix is not None and state is not None:
            if target is not None and prefix.kv is not None:
                exact_prefix = bool(torch.equal(target[:, :, :, :start], prefix.kv))
                target = torch.cat([prefix.kv, target[:, :, :, start:]], dim=3)
            exact_prefix = exact_prefix and state.exact_until(start)
        dictionary = (self._dictionaries.for_coding(coding.tenant, coding.codec.identity().level)
                      if coding.codec.mixes else None)
        encoded = coding.codec.encode(tokens, target, prefix, dictionary)
        exact = encoded.kv_exact and exact_prefix
        record = _record(encoded, coding.index, parent, start, exact)
        span = self._commit(coding, CommitPlan(coding.name, len(tokens), coding.expect, record,
                                               parent, coding.index_keys,
                                               encoded.session.dictionary),
                            encoded.session.kv_digest)
        if encoded.kv is not None or not coding.codec.uses_kv:
            spans = state.spans_until(start) if state is not None and parent is not None else ()
            inexact = (None if state is None or parent is None
                       else inexact_until(state.inexact_from, start))
            if inexact is None and not exact:
                inexact = start
            self._hot.put(self._chains.root(coding.tenant), ChainState(
                tuple(tokens), encoded.kv, inexact, (*spans, (span, start))))
        return PutResult(coding.name, len(tokens), start, len(tokens) - start, span,
                         len(record), encoded.coded_bytes, coding.match.candidates,
                         self._backend.round_trips - coding.started, encoded.theorem1)

    def _commit(self, coding: _Coding, plan: CommitPlan, kv_digest: bytes | None) -> SpanId:
        """Commit ``plan`` with the row's binding (invariant 6); ``kv_digest``: the one the
        session's span's record holds."""
        ns, name, tokens = coding.tenant.key, coding.name, coding.tokens

        def binding(span: SpanId) -> Binding:
            return session_binding(ns, name, len(tokens), span, tokens, kv_digest)

        plan = dataclasses.replace(plan, binding=binding)
        try:
            return self._backend.commit(coding.tenant.key, plan)
        except SessionExistsError:
            raise SessionExistsError(
                f"namespace {coding.tenant.name!r} already holds session {plan.session!r}: "
                "delete it first, or append to it") from None
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
        tenant = Tenant.of(namespace)
        if name.startswith(PIN_PREFIX):
            raise InvalidSessionIdError(
                f"session {name!r} is a pinned prefix (SessionStore.pin_prefix): its tokens are "
                "fixed by its name; append to a session of another id")
        added = [int(t) for t in new_tokens]
        if not added:
            raise EmptyInputError("append needs at least one new token")
        started = self._backend.round_trips
        (found,) = self._backend.fetch_sessions(tenant.key, [name])
        if found is None:
            raise self._not_found(name, tenant)
        entry = found.entry
        records = self._chains.records()
        self._limit(name, found, None, records)
        state = self._chains.states(tenant, [found.chain], records=records)[entry.span]
        self._check_row(tenant, name, found, state, records)
        # the new span is coded by this worker's codec for the chain's level (the chain's own
        # may be an earlier release's, or another machine's at a portable level)
        stored = records.get(found.chain[-1]).codec
        codec, index = self._registry.for_level(stored.identity().level)
        tokens = list(state.tokens[: entry.length]) + added
        target = self._appended_kv(_kv_tensor(new_kv), state, entry.length, len(added),
                                   codec.max_prefix_error)
        keys = self._prefixes.keys(tenant, tokens, after=entry.length)[1]
        coding = _Coding(tenant, name, tokens, target, codec, index,
                         Match(entry.length, state, 0), tuple(keys), entry, started)
        try:
            return self._code_and_commit(coding)
        except ParentGoneError:
            raise self._not_found(name, tenant) from None
        except DictionaryGoneError:
            raise ConcurrentUpdateError(
                f"session {name!r}: the namespace's dictionary was replaced and removed while "
                "this call coded with it; retry") from None

    @staticmethod
    def _appended_kv(target: torch.Tensor | None, state: ChainState, stored: int, added: int,
                     tolerance: float) -> torch.Tensor | None:
        """The extended session's KV from ``new_kv`` (of the new tokens, or of all)."""
        if target is None:
            return None
        if target.shape[3] == added and state.kv is not None:
            return torch.cat([state.kv[:, :, :, :stored], target], dim=3)
        if target.shape[3] != stored + added:
            raise InvalidKVError(
                f"new_kv holds {target.shape[3]} tokens: pass the KV of the {added} new tokens "
                f"or of all {stored + added} tokens of the extended session")
        if state.kv is not None:
            error = float((target[:, :, :, :stored] - state.kv[:, :, :, :stored]).abs().max())
            if error > tolerance:
                raise InvalidKVError(
                    f"new_kv differs from the stored session's KV over the stored tokens by "
                    f"{error:.3g}, more than the tolerance {tolerance}: pass the KV of the new "
                    "tokens alone")
        return target

    def get(self, session_id: str, *, namespace: str, max_tokens: int | None = None
            ) -> StoredSession:
        """The session's tokens and KV, decoded and checked (invariants 6 and 7)."""
        return self.get_many([session_id], namespace=namespace, max_tokens=max_tokens)[0]

    def get_many(self, session_ids: Sequence[str], *, namespace: str,
                 max_tokens: int | None = None) -> list[StoredSession]:
        """Many sessions of one namespace, decoded together (shared forwards where possible).

        A session, or a span of its chain, claiming more than ``max_tokens`` tokens (default:
        the context of the model that coded it) raises ``SessionTooLongError`` before any
        forward; a row that does not match what its chain decodes to raises
        ``CorruptRecordError`` naming the session.
        """
        if max_tokens is not None and not is_int(max_tokens):
            raise InvalidArgumentTypeError(
                f"max_tokens is a {type(max_tokens).__name__}: pass an int or None")
        if max_tokens is not None and max_tokens < 1:
            raise InvalidTokensError(f"max_tokens is {max_tokens}: pass a positive number of "
                                     "tokens, or None for the model's context")
        names = [check_session_id(s) for s in session_ids]
        return [session for _, session in self._read(Tenant.of(namespace), names, max_tokens)]

    def _read(self, tenant: Tenant, names: Sequence[SessionName], max_tokens: int | None
              ) -> list[tuple[SessionChain, StoredSession]]:
        found = self._backend.fetch_sessions(tenant.key, names)
        chains = []
        for name, item in zip(names, found, strict=True):
            if item is None:
                raise self._not_found(name, tenant)
            chains.append(item)
        records = self._chains.records()  # each record parsed once in this call
        for name, chain in zip(names, chains, strict=True):
            self._limit(name, chain, max_tokens, records)
        states = self._chains.states(tenant, [c.chain for c in chains], max_tokens, records)
        out = []
        for name, chain in zip(names, chains, strict=True):
            state = states[chain.entry.span]
            self._check_row(tenant, name, chain, state, records)
            length = chain.entry.length
            kv = None if state.kv is None else state.kv[:, :, :, :length].contiguous()
            out.append((chain, StoredSession(
                name, tenant.name, list(state.tokens[:length]),
                None if kv is None else cache_from_tensor(kv), kv, state.exact_until(length))))
        return out

    def _limit(self, name: SessionName, chain: SessionChain, max_tokens: int | None,
               records: SpanRecords) -> None:
        """``SessionTooLongError`` if the row of ``name`` claims more tokens than
        ``max_tokens`` or, without one, than the context of its last span's codec (invariant
        7)."""
        if not chain.chain:
            raise CorruptRecordError(f"session {name!r}'s row names no span: the store's "
                                     "metadata was damaged")
        limit = max_tokens
        if limit is None:
            limit = records.get(chain.chain[-1]).codec.max_tokens
        if limit is not None and chain.entry.length > limit:
            raise SessionTooLongError(
                f"session {name!r}'s row claims {chain.entry.length:,} tokens, more than "
                f"{limit:,} ({'max_tokens' if max_tokens is not None else 'its codec limit'}): "
                "refused before any forward; pass a larger max_tokens if the session is yours")

    def _check_row(self, tenant: Tenant, name: SessionName, found: SessionChain,
                   state: ChainState, records: SpanRecords) -> None:
        """The row against its decoded chain (invariant 6)."""
        entry = found.entry
        _check_length(tenant, name, entry, state.spans[-1][1], len(state.tokens))
        if entry.binding is not None:
            _check_binding(tenant, name, entry, tokens_digest(state.tokens[: entry.length]),
                           records.get(found.chain[-1]).record.kv_digest)

    def delete(self, session_id: str, *, namespace: str) -> None:
        """Remove a session; spans no other session needs go with it."""
        name = check_session_id(session_id)
        tenant = Tenant.of(namespace)
        if not self._backend.delete(tenant.key, name):
            raise self._not_found(name, tenant)

    def exists(self, session_id: str, *, namespace: str) -> bool:
        """Whether the namespace holds ``session_id`` (one index lookup, nothing decoded)."""
        name = check_session_id(session_id)
        (found,) = self._backend.fetch_sessions(Tenant.of(namespace).key, [name])
        return found is not None

    def list(self, *, namespace: str) -> list[SessionName]:
        """The namespace's session ids, sorted."""
        return self._backend.names(Tenant.of(namespace).key)

    def stat(self, session_id: str, *, namespace: str) -> SessionStat:
        """A session's size: tokens, bytes of its chain, and how many of them are shared.

        It decodes nothing, so it checks what a get checks without a decode: the row (its form,
        its binding or its entry on the legacy list), the chain's walk and records, the row's
        length against its last span's tokens, and the binding where the row ends at its
        span's last token (``binding_checked``), compared over the tokens digest the span's
        record holds. A row ending inside its span has a binding over tokens only a decode
        gives: ``get`` or ``audit_deep`` checks it, not ``stat``. Each failure is
        ``CorruptRecordError`` naming the session, as a get's would be.
        """
        name = check_session_id(session_id)
        tenant = Tenant.of(namespace)
        (found,) = self._backend.fetch_sessions(tenant.key, [name])
        if found is None:
            raise self._not_found(name, tenant)
        if not found.chain:
            raise CorruptRecordError(f"session {name!r}'s row names no span: the store's "
                                     "metadata was damaged")
        entry = found.entry
        records = self._chains.records()
        last = records.get(found.chain[-1]).record
        end = last.start + last.count
        _check_length(tenant, name, entry, last.start, end)
        checked = entry.binding is not None and entry.length == end
        if checked:
            _check_binding(tenant, name, entry, last.tokens_digest, last.kv_digest)
        counts = self._backend.refcounts(tenant.key, [s.span for s in found.chain])
        sizes = [len(s.record) for s in found.chain]
        exact = all(records.get(s).record.kv_exact for s in found.chain)
        return SessionStat(name, entry.length, len(sizes), sum(sizes),
                           sum(n for n, c in zip(sizes, counts, strict=True) if c > 1), exact,
                           checked)

    def gc(self, *, namespace: str) -> GcReport:
        """Remove garbage of crashed writers; repair counts that differ from a recount; remove
        the namespace's dictionaries that no stored session needs and that are not current."""
        return self._backend.gc(Tenant.of(namespace).key)

    def audit(self, *, namespace: str) -> AuditReport:
        """Recount the namespace's references and compare them with the stored counts."""
        return self._backend.audit(Tenant.of(namespace).key)

    def audit_deep(self, *, namespace: str, max_tokens: int | None = None) -> DeepAuditReport:
        """``audit``, then decode and check every session of the namespace, one at a time:
        name the ones that end in a ``SeqKVError`` and the ones read without a binding."""
        tenant = Tenant.of(namespace)
        report = self._backend.audit(tenant.key)
        damaged: list[DamagedSession] = []
        unbound: list[str] = []
        names = self._backend.names(tenant.key)
        for raw in names:
            try:
                name = check_session_id(raw)
                ((chain, _),) = self._read(tenant, [name], max_tokens)
            except SeqKVError as error:
                damaged.append(DamagedSession(str(raw), type(error).__name__, str(error)))
                continue
            if chain.entry.binding is None:
                unbound.append(name)
        return DeepAuditReport(report, len(names), tuple(damaged), tuple(unbound))

    def byte_counts(self, *, namespace: str) -> ByteCounts:
        return self._backend.byte_counts(Tenant.of(namespace).key)

    def put_dictionary(self, dictionary: Dictionary, *, namespace: str) -> StoredDictionary:
        """Store ``dictionary`` in ``namespace`` (content-addressed by its digest) and make it
        the namespace's current one: later puts and appends at ``portable+mix`` code with it.

        The dictionary must have been built for this namespace (``build_dictionary(...,
        namespace=...)``, CLI ``seqkv dict build --namespace``). Spans coded with an earlier
        dictionary keep decoding with it; ``gc`` removes a dictionary only once no session
        needs it and it is not current.
        """
        return self._dictionaries.put(Tenant.of(namespace), dictionary)

    def current_dictionary(self, *, namespace: str) -> Dictionary | None:
        """The namespace's current dictionary (None: none was put)."""
        return self._dictionaries.current(Tenant.of(namespace))

    def dictionaries(self, *, namespace: str) -> builtins.list[DictionaryDigest]:
        """The digests of the dictionaries the namespace stores, sorted."""
        return self._dictionaries.digests(Tenant.of(namespace))


def _check_length(tenant: Tenant, name: SessionName, entry: SessionEntry, start: int,
                  end: int) -> None:
    """The row's length against its span's tokens ``start`` to ``end - 1`` (invariant 6)."""
    if not start < entry.length <= end:
        raise CorruptRecordError(
            f"session {name!r} in namespace {tenant.name!r}: its row claims "
            f"{entry.length:,} tokens of span {entry.span}, which holds tokens {start:,} to "
            f"{end - 1:,}: the row was damaged")


def _check_binding(tenant: Tenant, name: SessionName, entry: SessionEntry, tokens: Digest,
                   kv_digest: bytes | None) -> None:
    """The row's binding against the digest of its ``entry.length`` tokens and its span's KV
    digest (invariant 6)."""
    if entry.binding != digest_binding(tenant.key, name, entry.length, entry.span, tokens,
                                       kv_digest):
        raise CorruptRecordError(
            f"session {name!r} in namespace {tenant.name!r} fails its binding: its row "
            "(span, length) or the records of its chain were damaged, moved or copied from "
            "another session")


def _check_pin_name(name: SessionName, tenant: Tenant, tokens: Sequence[int]) -> None:
    """A session id starting ``prefix:`` names a pinned prefix (``seqkv.store.pins``): it may
    hold only the tokens whose content hash it spells, so a pin row never holds other tokens."""
    if name.startswith(PIN_PREFIX) and name != pin_name(
            prefix_hash(Namespace(tenant.name), tokens)):
        raise InvalidSessionIdError(
            f"session ids starting {PIN_PREFIX!r} name pinned prefixes by the content hash of "
            f"their tokens, and {name[:24]!r}... is not these tokens' hash: use "
            "SessionStore.pin_prefix, or another id")

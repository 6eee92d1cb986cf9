"""Decoding chains of spans: a session's tokens and KV, parents first, sharing forwards.

A session is a chain of spans, each coded against its parent's chain cut at its ``start``. To
rebuild one, every span of the chain not held in this worker's hot tier is decoded, parents
first, each round one ``decode_many`` per codec (sessions at levels that batch share forwards).

Invariants:
1. A span's prefix is exactly what a decoder rebuilt: its parent's decoded chain cut at
   ``start`` (enforced: prefixes come only from decoded or hot states), and a record is decoded
   only when the parent it names is the one the store's chain names (enforced; else
   ``CorruptRecordError``).
2. A chain that loops or names a span it does not hold ends in ``CorruptRecordError``, never in
   an endless loop (enforced: each round must decode at least one span).
3. Every decoded span is verified by its codec before it enters the hot tier (enforced by the
   codecs, ``seqkv.store.codec`` invariant 1).
4. No span is decoded whose record claims tokens past the caller's ``max_tokens`` (default: its
   codec's ``max_tokens``, the model's context): ``SessionTooLongError`` before any forward
   (enforced in ``_pending``, which reads every record before ``states`` decodes one).
5. A record's ``start`` is the one its writer writes: past its parent span's first token and
   at most its parent's chain length (the writer's parent is the span holding token
   ``start - 1``); any other start is ``CorruptRecordError`` before the span decodes, even one
   that would decode to the same tokens (a start past the parent's end cuts the same prefix)
   (enforced in ``_decode_group``, both backends).
6. A codec's ``decode_many`` gives the chain's tokens, the prefix's included (``SpanItem``'s
   prefix is the parent's decoded chain, which the codec verifies with the record's tokens
   digest): a result of any other length than the record's ``start + count`` is
   ``StoreVerificationError`` before it enters the hot tier (enforced in ``_decode_group``).

Each record is parsed once per call (``SpanRecords``): a get reads its last span's record for
the row's limit, for the decode and for the row's check, and every span's codec once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqkv.formats.span import SpanRecord, read_frame, read_span
from seqkv.store.backends.base import StoreBackend, StoredSpan
from seqkv.store.codec import SpanCodec, SpanItem
from seqkv.store.dictionaries import NamespaceDictionaries
from seqkv.store.errors import CorruptRecordError, SessionTooLongError, StoreVerificationError
from seqkv.store.hot import ChainState, HotRoot, HotTier, inexact_until
from seqkv.store.ids import SpanId, Tenant
from seqkv.store.registry import CodecRegistry


@dataclass(frozen=True, slots=True)
class ReadSpan:
    """A stored span's record, parsed, and the codec that decodes it here."""

    record: SpanRecord
    codec: SpanCodec


class SpanRecords:
    """The records of one call's chains, each parsed once (by span id: a span id names one
    record in a store, ``seqkv.store.backends.base`` invariant 4). Made per call, never kept:
    what a call fetched is what it reads."""

    def __init__(self, decoder: ChainDecoder) -> None:
        self._decoder = decoder
        self._read: dict[SpanId, ReadSpan] = {}

    def get(self, stored: StoredSpan) -> ReadSpan:
        read = self._read.get(stored.span)
        if read is None:
            read = self._decoder.read(stored)
            self._read[stored.span] = read
        return read


class ChainDecoder:
    """Decodes the spans of a store's chains into chain states, keeping them hot."""

    def __init__(self, backend: StoreBackend, registry: CodecRegistry, hot: HotTier,
                 dictionaries: NamespaceDictionaries) -> None:
        self._backend = backend
        self._registry = registry
        self._hot = hot
        self._dictionaries = dictionaries

    def root(self, tenant: Tenant) -> HotRoot:
        """The hot tier's trie root of ``tenant`` in this store."""
        return (self._backend.store_id(), tenant.key)

    def read(self, stored: StoredSpan) -> ReadSpan:
        """A stored span's record, read in the layout its codec wrote, and that codec."""
        frame = stored.frame if stored.frame is not None else read_frame(stored.record)
        codec, layout = self._registry.for_index(frame.codec)
        return ReadSpan(read_span(stored.record, layout), codec)

    def records(self) -> SpanRecords:
        """A fresh cache of parsed records, for one call."""
        return SpanRecords(self)

    def state(self, tenant: Tenant, span: SpanId) -> ChainState | None:
        """The decoded chain through ``span`` (None: the span is gone)."""
        hot = self._hot.state(self.root(tenant), span)
        if hot is not None:
            return hot
        chain = self._backend.fetch_chain(tenant.key, span)
        if chain is None:
            return None
        return self.states(tenant, [chain])[span]

    def _pending(self, tenant: Tenant, chains: Sequence[tuple[StoredSpan, ...]],
                 states: dict[SpanId, ChainState], max_tokens: int | None,
                 records: SpanRecords) -> dict[SpanId, ReadSpan]:
        """The records of every span of ``chains`` that is neither hot nor decoded yet, each
        checked against the parent the store's chain names."""
        need: dict[SpanId, ReadSpan] = {}
        for chain in chains:
            for position in range(len(chain) - 1, -1, -1):
                stored = chain[position]
                if stored.span in states or stored.span in need:
                    break
                hot = self._hot.state(self.root(tenant), stored.span)
                if hot is not None:
                    states[stored.span] = hot
                    break
                read = records.get(stored)
                record = read.record
                parent = chain[position - 1].span if position else None
                if record.parent != parent:
                    raise CorruptRecordError(
                        f"span {stored.span}'s record names parent {record.parent}, the store's "
                        f"chain {parent}: the record or the store's metadata was damaged")
                self._check_count(stored.span, read, max_tokens)
                need[stored.span] = read
        return need

    @staticmethod
    def _check_count(span: SpanId, read: ReadSpan, max_tokens: int | None) -> None:
        """Invariant 4: the record's tokens end within the limit."""
        record = read.record
        limit = max_tokens if max_tokens is not None else read.codec.max_tokens
        if limit is not None and record.start + record.count > limit:
            raise SessionTooLongError(
                f"span {span}'s record claims tokens {record.start:,} to "
                f"{record.start + record.count - 1:,}, past "
                f"{'max_tokens' if max_tokens is not None else 'its codec limit'} of "
                f"{limit:,}: refused before any forward")

    @staticmethod
    def _check_start(span: SpanId, record: SpanRecord, parent: ChainState) -> None:
        """Invariant 5: a span starts inside its parent's own tokens."""
        first = parent.spans[-1][1]
        if not first < record.start <= len(parent.tokens):
            raise CorruptRecordError(
                f"span {span}'s record starts at token {record.start:,}, but its parent span "
                f"{record.parent} holds tokens {first:,} to {len(parent.tokens) - 1:,}: a span "
                "continues its parent inside the parent's own tokens; the record was damaged")

    def states(self, tenant: Tenant, chains: Sequence[tuple[StoredSpan, ...]],
               max_tokens: int | None = None, records: SpanRecords | None = None
               ) -> dict[SpanId, ChainState]:
        """The chain state of every span in ``chains`` (and of what decoding them needed);
        ``records``: the call's parsed records, if it parsed some already."""
        states: dict[SpanId, ChainState] = {}
        need = self._pending(tenant, chains, states, max_tokens,
                             self.records() if records is None else records)
        while need:
            ready = [span for span, read in need.items()
                     if read.record.parent is None or read.record.parent in states]
            if not ready:
                raise CorruptRecordError(
                    f"the store's chains through spans {sorted(need)[:8]} loop or name a parent "
                    "they do not hold: the store's metadata was damaged")
            groups: dict[int, list[SpanId]] = {}
            for span in ready:
                groups.setdefault(need[span].record.codec, []).append(span)
            for spans in groups.values():
                group = [(s, need.pop(s)) for s in spans]
                self._decode_group(tenant, group[0][1].codec,
                                   [(s, read.record) for s, read in group], states)
        return states

    def _decode_group(self, tenant: Tenant, codec: SpanCodec,
                      spans: list[tuple[SpanId, SpanRecord]],
                      states: dict[SpanId, ChainState]) -> None:
        """Decode spans of one stored codec, ``codec`` its reader here."""
        items = []
        for span, record in spans:
            parent = None if record.parent is None else states[SpanId(record.parent)]
            if parent is not None:
                self._check_start(span, record, parent)
            prefix = None if parent is None else parent.prefix(record.start)
            dictionary = (None if record.dictionary is None
                          else self._dictionaries.required(tenant, record.dictionary))
            items.append(SpanItem(record, prefix, dictionary))
        for (span, record), result in zip(spans, codec.decode_many(items), strict=True):
            if len(result.tokens) != record.start + record.count:
                raise StoreVerificationError(
                    f"span {span}'s codec decoded {len(result.tokens):,} tokens of its chain, "
                    f"its record {record.start + record.count:,}: a codec returns the chain's "
                    "tokens, the prefix's included (``seqkv.store.codec`` invariant 1)")
            parent = None if record.parent is None else states[SpanId(record.parent)]
            inexact = None if parent is None else inexact_until(parent.inexact_from,
                                                                  record.start)
            if inexact is None and not (record.kv_exact and result.kv_exact):
                inexact = record.start
            state = ChainState(
                tuple(result.tokens), result.kv, inexact,
                (parent.spans_until(record.start) if parent else ()) + ((span, record.start),))
            states[span] = state
            self._hot.put(self.root(tenant), state)

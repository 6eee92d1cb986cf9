"""What a store worker keeps in memory within a byte budget: the prefix trie of the chains it
decoded or coded (the hot tier, ``seqkv.trie.cache.RadixCache``), and mixing dictionaries.

Motivation: coding a session against a shared prefix needs the prefix's tokens and KV; decoding
them costs model forwards, and finding them in the backend's index costs a request. Popular
prefixes (system prompts) are asked for again and again, so a worker keeps every chain it
decoded or coded in a radix trie, up to a byte budget: a put, an append or a get finds the
longest prefix it holds token by token, without a request or a decode. The backend's index
(``seqkv.store.index``) stays the cross-process index for what the trie does not hold.

Invariants:
1. Each trie node remembers the chain of stored spans (``ChainSpans``) whose decode gave its
   tokens and KV; a chain's first ``n`` tokens and their KV are a function of the spans holding
   them (a span decodes against its parent's chain cut at its start,
   ``seqkv.store.chains`` invariant 1), so two nodes agree when their chains, cut at the node's
   end, name the same spans (enforced: ``ChainSpans.cut``). Span ids are never reused within a
   store (``seqkv.store.backends.base``, invariant 4), and the trie's roots are per (store id,
   namespace key), so a hit is always the spans' own decode (enforced by the key).
2. ``nbytes <= capacity`` after every insert unless an in-flight put holds its matched path
   locked (``seqkv.trie.cache`` invariant 3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from seqkv.eviction import EvictionSizes
from seqkv.session import Prefix
from seqkv.store.ids import NamespaceKey, SpanId
from seqkv.trie.cache import CacheMatch, CacheNode, RadixCache

HotRoot = tuple[str, NamespaceKey]  # (store id, namespace key): one trie root each


def spans_until(spans: tuple[tuple[SpanId, int], ...], length: int
                ) -> tuple[tuple[SpanId, int], ...]:
    """The (span, start) pairs of a chain holding tokens ``0 .. length - 1``."""
    return tuple((span, start) for span, start in spans if start < length)


def inexact_until(inexact_from: int | None, length: int) -> int | None:
    """Where a chain's KV stops being exact, seen from its first ``length`` tokens: None when
    every token before ``length`` is exact."""
    return inexact_from if inexact_from is not None and inexact_from < length else None


@dataclass(frozen=True, slots=True)
class ChainSpans:
    """The spans of a chain, root first, and the first position of its first span whose KV is
    not exact (None: all exact): what a trie node remembers of the chain that gave its tokens
    and KV (invariant 1). A node's source may be a longer chain than the node's path, so
    exactness is read at the cut, never for the whole chain."""

    spans: tuple[tuple[SpanId, int], ...]  # (span, start) of each span, root first
    inexact_from: int | None

    def cut(self, length: int) -> tuple[tuple[SpanId, int], ...]:
        """The spans holding tokens ``0 .. length - 1``: their identity."""
        return spans_until(self.spans, length)


@dataclass(frozen=True)
class ChainState:
    """The decoded chain of spans through one span: all its tokens and KV."""

    tokens: tuple[int, ...]
    kv: torch.Tensor | None  # [layers, 2, kv_heads, len(tokens), head_dim] float32
    # the start of the first span whose KV is not what was put (None: all exact); a cut
    # before it is exact even when the chain is not
    inexact_from: int | None
    spans: tuple[tuple[SpanId, int], ...]  # (span, start) of each span, root first

    @property
    def kv_exact(self) -> bool:
        return self.inexact_from is None

    def exact_until(self, length: int) -> bool:
        """Whether the KV of tokens ``0 .. length - 1`` is exact."""
        return inexact_until(self.inexact_from, length) is None

    def spans_until(self, length: int) -> tuple[tuple[SpanId, int], ...]:
        """The spans holding tokens ``0 .. length - 1``."""
        return spans_until(self.spans, length)

    def span_at(self, position: int) -> SpanId:
        """The span holding token ``position``."""
        holder = self.spans[0][0]
        for span, start in self.spans:
            if start > position:
                break
            holder = span
        return holder

    def prefix(self, length: int) -> Prefix:
        """The chain cut to its first ``length`` tokens, as the prefix a child continues."""
        kv = None if self.kv is None else self.kv[:, :, :, :length]
        return Prefix(self.tokens[:length], kv)

    @property
    def nbytes(self) -> int:
        return 8 * len(self.tokens) + (0 if self.kv is None else self.kv.nbytes)


@dataclass(frozen=True)
class HotMatch:
    """The longest prefix the trie holds: a chain state of exactly ``length`` tokens (None:
    none), and the node an in-flight put locks while it codes against it."""

    length: int
    state: ChainState | None
    node: CacheNode[ChainSpans] | None


def _state(match: CacheMatch[ChainSpans]) -> ChainState | None:
    source = match.source
    if source is None or match.length == 0:
        return None
    return ChainState(match.tokens, match.kv, inexact_until(source.inexact_from, match.length),
                      source.cut(match.length))


class HotTier:
    """Decoded and coded chains of one store, in a radix trie within a byte budget."""

    def __init__(self, capacity_bytes: int) -> None:
        self._trie: RadixCache[ChainSpans] = RadixCache(budget_bytes=capacity_bytes)
        self.hits = 0  # lookups by span or by tokens the trie answered
        self.misses = 0

    @property
    def trie(self) -> RadixCache[ChainSpans]:
        return self._trie

    @property
    def nbytes(self) -> int:
        return self._trie.nbytes

    def sizes(self) -> EvictionSizes:
        return self._trie.sizes()

    def state(self, root: HotRoot, span: SpanId) -> ChainState | None:
        """The chain through ``span``, if the trie holds all of it (invariant 1)."""
        found = self._trie.find(root, span)
        state = None if found is None else _state(found)
        if state is None:
            self.misses += 1
        else:
            self.hits += 1
        return state

    def match(self, root: HotRoot, tokens: Sequence[int]) -> HotMatch:
        """The longest prefix of ``tokens`` the trie holds from one chain, token by token."""
        found = self._trie.match_prefix(root, tokens)
        state = _state(found)
        if state is None:
            self.misses += 1
            return HotMatch(0, None, None)
        self.hits += 1
        return HotMatch(found.length, state, found.node)

    def put(self, root: HotRoot, state: ChainState) -> None:
        """Hold the chain ``state`` (tagged by its last span)."""
        self._trie.insert(root, state.tokens, state.kv, ChainSpans(state.spans, state.inexact_from),
                          tag=state.spans[-1][0])

    def lock(self, node: CacheNode[ChainSpans]) -> None:
        self._trie.lock(node)

    def unlock(self, node: CacheNode[ChainSpans]) -> None:
        self._trie.unlock(node)

    def discard(self, root: HotRoot, gone: Callable[[SpanId], bool]) -> int:
        """Forget every chain through a span ``gone`` names (it was deleted): nodes removed."""
        return self._trie.drop(root, lambda chain, depth: any(gone(s) for s, _ in chain.cut(depth)))

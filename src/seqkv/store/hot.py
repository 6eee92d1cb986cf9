"""The hot tier: decoded spans kept in this process, least recently used first out.

Motivation: coding a session against a shared prefix needs the prefix's tokens and KV; decoding
them costs model forwards. Popular prefixes (system prompts) are asked for again and again, so a
worker keeps what it decoded, up to a byte budget.

Invariants:
1. Entries are keyed by (store id, namespace key, span id); span ids are never reused within a
   store (``seqkv.store.backend``, invariant 4), so a hit is always the span's own decode
   (enforced by the key).
2. ``nbytes <= capacity`` after every ``put`` (enforced; an entry larger than the capacity is
   not kept).

``get`` moves the entry to the most recently used end; ``put`` may evict. The eviction order is
plain LRU (``collections.OrderedDict``): the trie's policies (``seqkv.trie.eviction``) rank
``TrieNode``s by fields this tier does not have (path probabilities), so they are not reused here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from seqkv.store.ids import NamespaceKey, SpanId

HotKey = tuple[str, NamespaceKey, SpanId]


@dataclass(frozen=True)
class ChainState:
    """The decoded chain of spans through one span: all its tokens and KV."""

    tokens: tuple[int, ...]
    kv: torch.Tensor | None  # [layers, 2, kv_heads, len(tokens), head_dim] float32
    kv_exact: bool
    spans: tuple[tuple[SpanId, int], ...]  # (span, start) of each span, root first

    def spans_until(self, length: int) -> tuple[tuple[SpanId, int], ...]:
        """The spans holding tokens ``0 .. length - 1``."""
        return tuple((span, start) for span, start in self.spans if start < length)

    def span_at(self, position: int) -> SpanId:
        """The span holding token ``position``."""
        holder = self.spans[0][0]
        for span, start in self.spans:
            if start > position:
                break
            holder = span
        return holder

    @property
    def nbytes(self) -> int:
        return 8 * len(self.tokens) + (0 if self.kv is None else self.kv.nbytes)


class HotTier:
    """A byte-bounded LRU map from spans to their decoded chain state."""

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity = capacity_bytes
        self._entries: OrderedDict[HotKey, ChainState] = OrderedDict()
        self._nbytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: HotKey) -> ChainState | None:
        state = self._entries.get(key)
        if state is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return state

    def discard(self, key: HotKey) -> None:
        """Forget ``key`` (its span was deleted)."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._nbytes -= old.nbytes

    def put(self, key: HotKey, state: ChainState) -> None:
        if state.nbytes > self._capacity:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._nbytes -= old.nbytes
        self._entries[key] = state
        self._nbytes += state.nbytes
        while self._nbytes > self._capacity:
            _, evicted = self._entries.popitem(last=False)
            self._nbytes -= evicted.nbytes

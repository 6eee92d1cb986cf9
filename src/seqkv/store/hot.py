"""What a store worker keeps in memory, least recently used first out, within a byte budget:
decoded spans (the hot tier) and mixing dictionaries.

Motivation: coding a session against a shared prefix needs the prefix's tokens and KV; decoding
them costs model forwards. Popular prefixes (system prompts) are asked for again and again, so a
worker keeps what it decoded, up to a byte budget. Dictionaries are read by every span coded
with them; they are kept the same way.

Invariants:
1. Entries of the hot tier are keyed by (store id, namespace key, span id); span ids are never
   reused within a store (``seqkv.store.backends.base``, invariant 4), so a hit is always the
   span's own decode (enforced by the key).
2. ``nbytes <= capacity`` after every ``put`` (enforced; an entry larger than the capacity is
   not kept).

``get`` moves the entry to the most recently used end; ``put`` may evict. The eviction order is
plain LRU, kept by ``seqkv.eviction.ByteLRU`` (the ledger the connector's warm tier and the
prefix trie use too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seqkv.eviction import ByteLRU
from seqkv.session import Prefix
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

    def prefix(self, length: int) -> Prefix:
        """The chain cut to its first ``length`` tokens, as the prefix a child continues."""
        kv = None if self.kv is None else self.kv[:, :, :, :length]
        return Prefix(self.tokens[:length], kv)

    @property
    def nbytes(self) -> int:
        return 8 * len(self.tokens) + (0 if self.kv is None else self.kv.nbytes)


class HotTier(ByteLRU[HotKey, ChainState]):
    """Decoded chain states by span, within a byte budget."""

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes, lambda state: state.nbytes)

"""Finding the longest stored prefix of a new session, verified token by token.

A put first walks this worker's prefix trie (``seqkv.store.hot``): the longest prefix it holds,
compared token by token, costs no request and no decode, and when it covers the whole session
the index is not asked at all. Otherwise the put computes the index keys of the session's
tokens at the spaced positions (``seqkv.store.index``), looks them all up in one request, then
decodes (or finds in the trie by span) the deepest candidates' chains and compares their tokens
with the session's; a chain it decodes enters the trie.

Invariants:
1. A session is never coded against a prefix whose tokens were not compared with its own: an
   index hit only names a candidate (enforced; tested with colliding 1-byte keys).
2. A candidate whose KV over the shared tokens differs from the caller's by more than the
   codec's tolerance is not used (enforced), and neither is one that carries KV for a codec
   without (or the reverse).
3. At most ``max_candidates`` index candidates are decoded or found hot per lookup (enforced);
   the trie's own match is not a candidate (it needs no decode).
4. A candidate whose chain is damaged (``CorruptRecordError``, ``StoreVerificationError``) is
   not used: the session is coded against another candidate or from its first token, and the
   damage is left for ``seqkv store audit --deep`` to name (enforced).
5. The trie's match is used only where it is longer than the index's (ties go to the index's
   candidate), so a put codes against the chain it would have found without the trie unless
   the trie holds a longer one (enforced in ``find``). A put the trie answers in full codes
   nothing and sets no index key, so it asks the index nothing; any other put looks up every
   indexed position, as without the trie, and sets the same keys (enforced).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seqkv.store.backends.base import StoreBackend
from seqkv.store.chains import ChainDecoder
from seqkv.store.codec import SpanCodec
from seqkv.store.errors import CorruptRecordError, StoreVerificationError
from seqkv.store.hot import ChainState, HotMatch, HotTier
from seqkv.store.ids import SpanId, Tenant
from seqkv.store.index import IndexSpacing, chain_keys
from seqkv.trie.cache import CacheNode


@dataclass(frozen=True, slots=True)
class Lookup:
    """A session's indexed positions, their keys, and the span each key names (or None)."""

    positions: list[int]
    keys: list[bytes]
    hits: list[SpanId | None]

    def keys_after(self, length: int) -> tuple[bytes, ...]:
        """The keys a new span continuing ``length`` stored tokens sets: past the match, or
        absent."""
        return tuple(k for p, k, h in zip(self.positions, self.keys, self.hits, strict=True)
                     if p > length or h is None)


@dataclass(frozen=True, slots=True)
class Match:
    """The longest verified stored prefix: its length and the chain holding it."""

    length: int
    state: ChainState | None
    candidates: int  # index candidates decoded or found hot
    # the trie node the match came from, locked until the put that found it commits (None:
    # the match came from the index, or nothing matched)
    node: CacheNode[Any] | None = None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class PrefixMatcher:
    """Looks up and verifies stored prefixes of one store."""

    def __init__(self, backend: StoreBackend, chains: ChainDecoder, hot: HotTier,
                 spacing: IndexSpacing, max_candidates: int) -> None:
        self._backend = backend
        self._chains = chains
        self._hot = hot
        self.spacing = spacing
        self._max_candidates = max_candidates

    def keys(self, tenant: Tenant, tokens: Sequence[int], after: int = 0
             ) -> tuple[list[int], list[bytes]]:
        positions = self.spacing.positions(len(tokens), after=after)
        return positions, chain_keys(tenant.key, tokens, positions, self.spacing.key_bytes)

    def lookup(self, tenant: Tenant, tokens: Sequence[int]) -> Lookup:
        """One index request for every indexed position of ``tokens``."""
        positions, keys = self.keys(tenant, tokens)
        return Lookup(positions, keys, self._backend.lookup(tenant.key, keys))

    def find(self, tenant: Tenant, tokens: Sequence[int], target: torch.Tensor | None,
             codec: SpanCodec, *, lock: bool) -> tuple[Match, Lookup | None]:
        """The longest stored prefix of ``tokens``: the trie's, or a longer one the index
        names (invariants 3 and 5), and the lookup (None: the trie held every token, so
        nothing new is coded and no index key is set); with ``lock``, the trie's matched path
        is locked until the put commits (the caller unlocks ``match.node``)."""
        hot = self._usable(self._hot.match(self._chains.root(tenant), tokens), target, codec)
        if hot.state is not None and hot.length == len(tokens):
            if lock and hot.node is not None:
                self._hot.lock(hot.node)
            return Match(hot.length, hot.state, 0, hot.node if lock else None), None
        lookup = self.lookup(tenant, tokens)
        match = self.match(tenant, tokens, target, codec, lookup)
        node = hot.node if lock and hot.state is not None else None
        if node is not None:
            self._hot.lock(node)  # the put codes against these tokens, whichever chain it takes
        if match.length >= hot.length or hot.state is None:
            return dataclasses.replace(match, node=node), lookup
        return Match(hot.length, hot.state, match.candidates, node), lookup

    @staticmethod
    def _usable(hot: HotMatch, target: torch.Tensor | None, codec: SpanCodec) -> HotMatch:
        """The trie's match, or none where a candidate would be refused (invariant 2)."""
        state = hot.state
        if state is None or (state.kv is not None) != codec.uses_kv:
            return HotMatch(0, None, None)
        if target is not None and state.kv is not None:
            error = (target[:, :, :, :hot.length] - state.kv).abs().max()
            if float(error) > codec.max_prefix_error:
                return HotMatch(0, None, None)
        return hot

    def match(self, tenant: Tenant, tokens: Sequence[int], target: torch.Tensor | None,
              codec: SpanCodec, lookup: Lookup) -> Match:
        """The longest stored prefix of ``tokens`` among the deepest candidates (invariants)."""
        candidates: list[tuple[int, SpanId]] = []
        for position, span in reversed(list(zip(lookup.positions, lookup.hits, strict=True))):
            if span is not None and all(span != s for _, s in candidates):
                candidates.append((position, span))
        best = Match(0, None, 0)
        tried = 0
        for position, span in candidates[: self._max_candidates]:
            tried += 1
            try:
                state = self._chains.state(tenant, span)
            except (CorruptRecordError, StoreVerificationError):
                continue  # invariant 4
            if state is None or (state.kv is not None) != codec.uses_kv:
                continue
            length = common_prefix(state.tokens, tokens)
            if target is not None and state.kv is not None and length > 0:
                error = (target[:, :, :, :length] - state.kv[:, :, :, :length]).abs().max()
                if float(error) > codec.max_prefix_error:
                    continue
            if length > best.length:
                best = Match(length, state, tried)
            if length >= position:
                break
        return Match(best.length, best.state, tried)

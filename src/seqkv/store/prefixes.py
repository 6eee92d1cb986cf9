"""Finding the longest stored prefix of a new session, verified token by token.

A put computes the index keys of the new session's tokens at the spaced positions
(``seqkv.store.index``), looks them all up in one request, then decodes (or finds hot) the
deepest candidates' chains and compares their tokens with the session's.

Invariants:
1. A session is never coded against a prefix whose tokens were not compared with its own: an
   index hit only names a candidate (enforced; tested with colliding 1-byte keys).
2. A candidate whose KV over the shared tokens differs from the caller's by more than the
   codec's tolerance is not used (enforced), and neither is one that carries KV for a codec
   without (or the reverse).
3. At most ``max_candidates`` chains are decoded or found hot per lookup (enforced).
4. A candidate whose chain is damaged (``CorruptRecordError``, ``StoreVerificationError``) is
   not used: the session is coded against another candidate or from its first token, and the
   damage is left for ``seqkv store audit --deep`` to name (enforced).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seqkv.store.backends.base import StoreBackend
from seqkv.store.chains import ChainDecoder
from seqkv.store.codec import SpanCodec
from seqkv.store.errors import CorruptRecordError, StoreVerificationError
from seqkv.store.hot import ChainState
from seqkv.store.ids import SpanId, Tenant
from seqkv.store.index import IndexSpacing, chain_keys


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
    candidates: int  # chains decoded or found hot


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class PrefixMatcher:
    """Looks up and verifies stored prefixes of one store."""

    def __init__(self, backend: StoreBackend, chains: ChainDecoder, spacing: IndexSpacing,
                 max_candidates: int) -> None:
        self._backend = backend
        self._chains = chains
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

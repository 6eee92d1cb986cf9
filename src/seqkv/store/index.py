"""The prefix index: truncated chain hashes of a session's tokens at a few positions.

Motivation: a worker putting a session must find the longest stored prefix among every session
of the namespace, on any machine, in a bounded number of round trips. As in vLLM's prefix cache,
each indexed position ``p`` gets a hash of all tokens before it: the chain of the one block hash
(``seqkv.blockhash.hash_block_tokens``) over the blocks between the indexed positions, rooted at
the namespace key, truncated to ``key_bytes`` (one pass gives every position's key); a worker
computes the hashes of its new session locally and looks
them all up in one pipelined request. Unlike vLLM the index is sparse: positions 16, 32, 64, 128
and then every 256 tokens (``IndexSpacing``), because an entry costs ~8 bytes and a 256-token
block codes to 130-400 bytes. A hit only names a candidate span: the store then decodes (or finds
hot) that span's tokens and extends the match token by token, so the match is exact and ends
where the tokens really diverge, not at an indexed position.

Invariants:
1. ``chain_keys`` depends only on the namespace key and ``tokens[:p]`` (enforced: the blocks end
   at the spacing's positions, which depend on nothing else): equal prefixes in one namespace
   meet, and other namespaces' keys never match (the namespace key is hashed into the root).
2. A hit is a hint, never trusted: a truncated-hash collision can only make the store decode a
   span that shares fewer tokens than the hit claims, which the exact comparison detects
   (enforced in ``SessionStore``; tested with 1-byte keys that collide on purpose).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqkv.blockhash import chain_root, hash_block_chain
from seqkv.store.ids import NamespaceKey

# NOTE: the keys' domain; the index entries of stores of schema 1 and 2 were keyed by another
# hash, and the upgrade to schema 3 drops them (``seqkv.store.backends.base`` invariant 8).
INDEX_DOMAIN = b"seqkv.store.index.v2"


@dataclass(frozen=True, slots=True)
class IndexSpacing:
    """Where sessions are indexed: ``first``, doubling up to ``step``, then every ``step``.

    >>> IndexSpacing().positions(1000)
    [16, 32, 64, 128, 256, 512, 768]
    >>> IndexSpacing().positions(1000, after=100)
    [128, 256, 512, 768]
    """

    first: int = 16
    step: int = 256
    # NOTE: 6 bytes: a lookup meets a false hit with probability ~entries / 2**48 (1e-9 at
    # 300,000 entries), and a false hit costs one candidate decode, never a wrong match.
    key_bytes: int = 6

    def __post_init__(self) -> None:
        if not (1 <= self.first <= self.step) or not 1 <= self.key_bytes <= 32:
            raise ValueError("IndexSpacing needs 1 <= first <= step and 1 <= key_bytes <= 32")

    def positions(self, end: int, after: int = 0) -> list[int]:
        """Indexed positions ``p`` with ``after < p <= end``."""
        out = []
        position = self.first
        while position < self.step and position <= end:
            if position > after:
                out.append(position)
            position *= 2
        position = self.step
        while position <= end:
            if position > after:
                out.append(position)
            position += self.step
        return out


def chain_keys(namespace: NamespaceKey, tokens: Sequence[int], positions: Sequence[int],
               key_bytes: int) -> list[bytes]:
    """The index key of ``tokens[:p]`` for each ``p`` in ``positions`` (increasing).

    >>> a = chain_keys(NamespaceKey(bytes(16)), list(range(40)), [16, 32], 6)
    >>> [key.hex() for key in a]
    ['00cd86517cab', '4ae435e456da']
    >>> chain_keys(NamespaceKey(bytes(16)), list(range(32)), [16, 32], 6) == a
    True
    """
    chain = hash_block_chain(chain_root(INDEX_DOMAIN, namespace), tokens, positions)
    return [key[:key_bytes] for key in chain]

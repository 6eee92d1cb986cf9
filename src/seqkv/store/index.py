"""The prefix index: truncated chain hashes of a session's tokens at a few positions.

Motivation: a worker putting a session must find the longest stored prefix among every session
of the namespace, on any machine, in a bounded number of round trips. As in vLLM's prefix cache,
each indexed position ``p`` gets a hash of all tokens before it (a running SHA-256, so one pass
gives every position's hash); a worker computes the hashes of its new session locally and looks
them all up in one pipelined request. Unlike vLLM the index is sparse: positions 16, 32, 64, 128
and then every 256 tokens (``IndexSpacing``), because an entry costs ~8 bytes and a 256-token
block codes to 130-400 bytes. A hit only names a candidate span: the store then decodes (or finds
hot) that span's tokens and extends the match token by token, so the match is exact and ends
where the tokens really diverge, not at an indexed position.

Invariants:
1. ``chain_keys`` depends only on the namespace key and ``tokens[:p]`` (enforced): equal prefixes
   in one namespace meet, and other namespaces' keys never match (the namespace key is hashed in).
2. A hit is a hint, never trusted: a truncated-hash collision can only make the store decode a
   span that shares fewer tokens than the hit claims, which the exact comparison detects
   (enforced in ``SessionStore``; tested with 1-byte keys that collide on purpose).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seqkv.store.ids import NamespaceKey

_DOMAIN = b"seqkv.store.index.v1\x00"


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
    """The index key of ``tokens[:p]`` for each ``p`` in ``positions`` (increasing)."""
    stream = hashlib.sha256(_DOMAIN + namespace)
    data = np.asarray(tokens, dtype="<i4")
    keys = []
    done = 0
    for position in positions:
        assert done <= position <= len(data), (done, position, len(data))
        stream.update(data[done:position].tobytes())
        done = position
        keys.append(stream.copy().digest()[:key_bytes])
    return keys

"""The trie metric d_T(s, s') = -log2 P_M(s ^ s') and nearest-session queries by it.

Paper: arXiv 2604.15356, layer 1. ``s ^ s'`` is the longest common prefix of two token sequences
and ``P_M`` the model's probability of it, the product of the per-token conditionals, so
``d_T(s, s') = sum of the surprisals -log2 P(t_i | t_<i) over the shared prefix``.

What holds and what does not (tests: ``tests/test_trie_metric.py``, with hypothesis):

1. ``d_T(s, s) = -log2 P_M(s) != 0`` for any sequence with a token of probability below 1, and
   ``d_T`` *grows* with the shared prefix: two sessions with no common first token are at
   distance 0, the "closest" pair there is. So ``d_T`` is not a metric, nor a pseudo-metric.
2. The paper's ultrametric inequality ``d(s, s'') <= max(d(s, s'), d(s', s''))`` is false:
   ``s = s'' = "ab"``, ``s' = "x"`` gives ``d(s, s'') = -log2 P("ab") > 0 = max(0, 0)``; so is
   ``s = "ab"``, ``s' = "x"``, ``s'' = "ac"`` (three distinct sequences).
3. What is true is the reversed three-point condition: ``d(s, s'') >= min(d(s, s'), d(s', s''))``,
   and the two smallest of the three pairwise values are equal (of three sequences, two pairs
   share the same shortest common prefix). Equivalently ``u = 2^-d_T = P_M(s ^ s')`` satisfies
   the strong triangle inequality ``u(s, s'') <= max(u(s, s'), u(s', s''))``, with
   ``u(s, s) = P_M(s) > 0``. ``u`` is the trie's ultrametric; ``d_T`` is its -log2.
4. Hence "nearest" means the smallest ``u``, the *largest* ``d_T``: the session sharing the most
   improbable (most informative) prefix, whose KV saves the most. The paper's lookup section,
   which maximises ``d``, agrees with this reading and contradicts its own cluster definition
   ``d <= delta`` (see ``seqkv.trie.clusters``).

Invariants:
1. Sequences that share a prefix carry the same log2-probabilities on it: a deterministic model
   assigns ``P(t_i | t_<i)`` from the prefix alone (assumed; the trie keeps the values of the
   first insert of each span).
2. Every surprisal is >= 0 (enforced at input: log2-probabilities are clamped to <= 0), so
   ``d_T`` is non-decreasing in the shared length.

``rank_sessions`` reads nodes and mutates nothing (no split, no statistics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from seqkv.trie.inputs import as_log2_probs, as_token_array
from seqkv.trie.keys import Namespace, SessionId
from seqkv.trie.node import TrieNode

TokenInput = Sequence[int] | npt.NDArray[np.integer]
LogProbInput = Sequence[float] | npt.NDArray[np.floating]


def common_prefix_length(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> int:
    """Length of the longest common prefix of two 1-D int64 arrays."""
    length = min(len(a), len(b))
    differ = np.flatnonzero(a[:length] != b[:length])
    return length if differ.size == 0 else int(differ[0])


def trie_distance(s: TokenInput, s_log2_probs: LogProbInput, other: TokenInput) -> float:
    """``d_T(s, other) = -log2 P_M(s ^ other)`` in bits, from ``s``'s log2-probabilities.

    >>> trie_distance([5, 6, 7], [-1.0, -2.0, -0.5], [5, 6, 9])
    3.0
    >>> trie_distance([5, 6, 7], [-1.0, -2.0, -0.5], [5, 6, 7])  # d(s, s) != 0
    3.5
    >>> trie_distance([5, 6, 7], [-1.0, -2.0, -0.5], [8])  # nothing shared: distance 0
    0.0
    """
    tokens = as_token_array(s, allow_empty=True)
    log2_probs = as_log2_probs(s_log2_probs, len(tokens))
    shared = common_prefix_length(tokens, as_token_array(other, allow_empty=True))
    return float(-np.sum(log2_probs[:shared])) + 0.0


def prefix_probability(s: TokenInput, s_log2_probs: LogProbInput, other: TokenInput) -> float:
    """``u(s, other) = 2^-d_T = P_M(s ^ other)``: the ultrametric that ``d_T`` is the -log2 of.

    >>> prefix_probability([5, 6, 7], [-1.0, -2.0, -0.5], [5, 6, 9])
    0.125
    """
    return float(2.0 ** -trie_distance(s, s_log2_probs, other))


@dataclass(frozen=True, slots=True)
class Neighbor:
    """A live session and its distance to a query."""

    session: SessionId
    distance_bits: float  # d_T(query, session): surprisal of the shared prefix
    shared_tokens: int  # length of the shared prefix
    session_tokens: int  # length of the session


@dataclass(frozen=True, slots=True)
class QueryPoint:
    """Where a query's walk down the trie stopped, without splitting anything."""

    namespace: Namespace
    full: tuple[TrieNode, ...]  # root first, then every node whose edge matched entirely
    partial: TrieNode | None  # the node whose edge matched only in part, if any
    matched: int  # tokens of the query found in the trie
    surprisal_bits: float  # -log2 P_M of the matched tokens


def rank_sessions(
    point: QueryPoint, sessions: Mapping[SessionId, TrieNode], k: int | None
) -> tuple[Neighbor, ...]:
    """The live sessions of the query's namespace, largest ``d_T`` (nearest) first.

    A session ending at node ``E`` shares with the query the prefix up to the deepest
    ancestor-or-self of ``E`` on the query's path, capped at the matched length. Ties go to the
    longer shared prefix, then to the older session.
    """
    on_path: dict[TrieNode, tuple[int, float]] = {
        node: (node.depth, node.surprisal_bits) for node in point.full
    }
    if point.partial is not None:
        on_path[point.partial] = (point.matched, point.surprisal_bits)
    found: dict[TrieNode, tuple[int, float]] = {}
    neighbors = []
    for session, end in sessions.items():
        if end.namespace != point.namespace:
            continue
        shared, bits = _shared_with_path(end, on_path, found)
        neighbors.append(
            Neighbor(session=session, distance_bits=bits, shared_tokens=shared,
                     session_tokens=end.depth)
        )
    neighbors.sort(key=lambda n: (-n.distance_bits, -n.shared_tokens, n.session))
    return tuple(neighbors if k is None else neighbors[:k])


def _shared_with_path(
    end: TrieNode,
    on_path: dict[TrieNode, tuple[int, float]],
    found: dict[TrieNode, tuple[int, float]],
) -> tuple[int, float]:
    climbed = []
    node: TrieNode | None = end
    result = (0, 0.0)
    while node is not None:
        if node in on_path:
            result = on_path[node]
            break
        if node in found:
            result = found[node]
            break
        climbed.append(node)
        node = node.parent
    for visited in climbed:
        found[visited] = result
    return result

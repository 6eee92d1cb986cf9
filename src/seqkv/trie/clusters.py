"""The paper's "semantic clusters", reduced to their sound part, and the storage corollary.

Paper: arXiv 2604.15356, layer 1. Sessions whose trie distance d_T is within a threshold delta
form a "semantic cluster"; a cluster shares the exact KV of its members' common prefix and stores
only "tail deltas relative to a cluster centroid". The corollary: relative storage
``1 - f (1 - l/n)``, with ``f`` the fraction of sessions in clusters, ``l`` the mean tail length and
``n`` the sequence length (``seqkv.proofs.storage`` derives it symbolically).

What the definition gets wrong, and what is implemented instead:

1. *The direction of the threshold.* ``d_T(s, s') = -log2 P_M(s ^ s')`` grows with the shared
   prefix: two sessions with no common first token are at distance 0. "d_T <= delta" therefore
   groups sessions that share *little* (every unrelated pair qualifies), and sharing an empty
   prefix saves nothing. The paper's own lookup section maximises d. Implemented: sessions are
   related when ``d_T(s, s') >= delta``, i.e. they share a prefix carrying at least ``delta`` bits
   of surprisal.
2. *Clusters need an equivalence relation.* With ``>=`` they get one: ``d_T(s, s'') >= min(d_T(s,
   s'), d_T(s', s''))`` (``seqkv.trie.metric``), so the relation is transitive, and it is
   reflexive on sessions with ``d_T(s, s) = -log2 P_M(s) >= delta``. The classes are the trie's
   subtrees below the point where the cumulative surprisal first reaches delta (the "delta-cut");
   a session whose whole surprisal stays below delta is related to nothing, not even itself.
3. *Centroid deltas are not deduplication.* Past the point where two sessions diverge, every KV
   vector depends on the diverging tokens through attention, so nothing after the divergence is
   shared exactly. "You are a helpful assistant" and "You are an AI assistant" share the KV of
   "You are" and nothing more; a tail "delta to a centroid" is a lossy or predictive coder (layer
   2's job), with no bound on its size. Implemented: each cluster stores its members' longest
   common prefix once; each member's tail is stored on its own, in full.
4. *The corollary forgets the shared prefix.* ``1 - f (1 - l/n)`` charges clustered sessions only
   their tails; the prefix each cluster shares has to be stored once too, which adds
   ``K p / (N n)`` (K clusters of mean shared length p among N sessions). ``ClusterReport`` gives
   the paper's prediction, the corrected one and the measured ratio side by side; with unequal
   lengths ``n`` is the mean session length and ``l`` the mean tail of clustered sessions.
5. *The threshold decides nothing about what can be shared.* A prefix trie shares every common
   prefix, whatever its surprisal; delta only decides which sharing the corollary counts. The
   trie's own storage (``bytes_trie`` in ``research.bench.trie``) is at most the clusters' storage,
   because it also shares prefixes inside a cluster and below delta.

Invariants:
1. Two sessions are in one cluster iff ``d_T(s, s') >= delta``, for sessions whose own surprisal
   reaches delta (checked against pairwise d_T with hypothesis).
2. ``positions_clustered <= positions_naive`` (checked); the measured ratio is exact, counted in
   token positions (every position costs the same bytes).
3. Sequences that share a prefix carry the same log2-probabilities on it (assumed, as in
   ``seqkv.trie.metric``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seqkv.errors import EmptyInputError
from seqkv.trie.errors import TrieConfigError
from seqkv.trie.keys import DEFAULT_NAMESPACE, Namespace
from seqkv.trie.metric import common_prefix_length
from seqkv.trie.radix import PrefixTrie
from seqkv.trie.sequence import ScoredSequence


@dataclass(frozen=True, slots=True)
class Cluster:
    """Sessions related by ``d_T >= delta``; they store ``shared_length`` tokens once."""

    members: tuple[int, ...]  # indices into the sequences given to cluster_sessions
    cut_length: int  # tokens until the cumulative surprisal reaches delta (the key)
    shared_length: int  # the members' longest common prefix: stored once
    shared_surprisal_bits: float  # d_T of the two closest-diverging members


@dataclass(frozen=True)
class ClusterReport:
    """Clusters of two or more sessions at one threshold, and the storage they imply.

    With sessions of equal length, ``storage_predicted_with_prefix == storage_measured`` exactly.
    With unequal lengths the rest of the gap is the corollary's equal-length assumption: measured
    ``= 1 - f (n_c - l) / n + K p / (N n)`` with ``n_c`` the mean length of clustered sessions.
    """

    threshold_bits: float
    sessions: int
    clusters: tuple[Cluster, ...]
    positions_naive: int  # every session stored in full
    positions_clustered: int  # shared prefixes once, every tail and unclustered session in full
    tail_positions: int  # tails of clustered sessions, after their cluster's shared prefix

    @property
    def clustered_sessions(self) -> int:
        return sum(len(c.members) for c in self.clusters)

    @property
    def clustered_fraction(self) -> float:
        """``f``: the fraction of sessions in a cluster of two or more."""
        return self.clustered_sessions / self.sessions

    @property
    def mean_length(self) -> float:
        """``n``: the mean session length."""
        return self.positions_naive / self.sessions

    @property
    def mean_tail_length(self) -> float:
        """``l``: the mean tail (tokens after the cluster's shared prefix) of clustered sessions."""
        return self.tail_positions / self.clustered_sessions if self.clusters else 0.0

    @property
    def mean_shared_length(self) -> float:
        """``p``: the mean shared prefix length over clusters."""
        if not self.clusters:
            return 0.0
        return sum(c.shared_length for c in self.clusters) / len(self.clusters)

    @property
    def storage_predicted(self) -> float:
        """The paper's corollary, ``1 - f (1 - l/n)``."""
        return 1 - self.clustered_fraction * (1 - self.mean_tail_length / self.mean_length)

    @property
    def storage_predicted_with_prefix(self) -> float:
        """The corollary plus each cluster's shared prefix stored once, ``+ K p / (N n)``."""
        stored_prefixes = len(self.clusters) * self.mean_shared_length
        return self.storage_predicted + stored_prefixes / (self.sessions * self.mean_length)

    @property
    def storage_measured(self) -> float:
        return self.positions_clustered / self.positions_naive


def cluster_sessions(sequences: Sequence[ScoredSequence], threshold_bits: float) -> ClusterReport:
    """Group sessions by ``d_T >= threshold_bits`` and count what the groups store.

    >>> a = ScoredSequence.of([1, 2, 3, 4], [-2.0, -2.0, -1.0, -1.0])
    >>> b = ScoredSequence.of([1, 2, 3, 9], [-2.0, -2.0, -1.0, -3.0])
    >>> c = ScoredSequence.of([7, 8, 5, 6], [-5.0, -1.0, -1.0, -1.0])
    >>> report = cluster_sessions([a, b, c], threshold_bits=4.0)
    >>> [(cl.members, cl.cut_length, cl.shared_length) for cl in report.clusters]
    [((0, 1), 2, 3)]
    >>> report.positions_naive, report.positions_clustered
    (12, 9)
    >>> report.storage_predicted, report.storage_predicted_with_prefix, report.storage_measured
    (0.5, 0.75, 0.75)
    """
    if not sequences or not any(len(s) for s in sequences):
        raise EmptyInputError("cluster_sessions needs at least one session holding tokens")
    if not (math.isfinite(threshold_bits) and threshold_bits >= 0):
        raise TrieConfigError(f"threshold_bits must be finite and >= 0, got {threshold_bits!r}")
    groups: dict[bytes, list[int]] = {}
    cuts: dict[bytes, int] = {}
    for index, sequence in enumerate(sequences):
        cut = _cut_length(sequence, threshold_bits)
        if cut is None:
            continue
        key = sequence.tokens[:cut].tobytes()
        groups.setdefault(key, []).append(index)
        cuts[key] = cut
    clusters = []
    for key, members in groups.items():
        if len(members) < 2:
            continue
        first = sequences[members[0]]
        shared = min(common_prefix_length(first.tokens, sequences[m].tokens) for m in members[1:])
        clusters.append(Cluster(
            members=tuple(members), cut_length=cuts[key], shared_length=shared,
            shared_surprisal_bits=float(-np.sum(first.log2_probs[:shared])) + 0.0,
        ))
    clusters.sort(key=lambda c: c.members[0])
    naive = sum(len(s) for s in sequences)
    stored = naive - sum((len(c.members) - 1) * c.shared_length for c in clusters)
    tails = sum(len(sequences[m]) - c.shared_length for c in clusters for m in c.members)
    return ClusterReport(
        threshold_bits=threshold_bits, sessions=len(sequences), clusters=tuple(clusters),
        positions_naive=naive, positions_clustered=stored, tail_positions=tails,
    )


def cluster_trie_sessions(
    trie: PrefixTrie, threshold_bits: float, namespace: Namespace = DEFAULT_NAMESPACE
) -> ClusterReport:
    """``cluster_sessions`` over the live sessions of one namespace of ``trie``."""
    return cluster_sessions(trie.session_sequences(namespace), threshold_bits)


def _cut_length(sequence: ScoredSequence, threshold_bits: float) -> int | None:
    """Tokens until the cumulative surprisal reaches the threshold; None if it never does."""
    if threshold_bits <= 0:
        return 0
    surprisal = np.cumsum(-sequence.log2_probs)  # [n]: -log2 P(t_1..t_i)
    first = int(np.searchsorted(surprisal, threshold_bits, side="left"))
    return None if first >= len(surprisal) else first + 1

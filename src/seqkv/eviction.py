"""Eviction of the prefix trie's unreferenced leaves: the policy protocol, LRU,
probability-weighted, and the queue.

Motivation: a memory budget needs a rule for what to drop. As in SGLang's RadixAttention, only
leaves that no live session references can go; after a leaf goes, its parent may become such a
leaf. The policy ranks candidates: LRU drops the least recently used; the probability-weighted
policy (this project's reading of arXiv 2604.15356, layer 1) drops what the model finds least
likely to recur.

Invariants:
1. A node with ``ref_count > 0``, a node with children, and a namespace root are never returned
   by ``EvictionQueue.pop`` (enforced: every pop re-checks ``TrieNode.evictable``).
2. A policy's priority depends only on node fields the trie changes when it touches or pushes the
   node (``last_access``, ``hit_count``, ``path_log2_prob``, ``nbytes``, ...), never on the
   wall clock or other nodes (assumed: it is the ``EvictionPolicy`` contract). The queue is a
   lazy heap: the trie pushes a node again whenever it becomes evictable or is touched while
   evictable, and older entries are skipped by version, so the order is exact under (2).
3. Lower priority is evicted first; ties go to the entry pushed first (enforced by a sequence
   number in each entry).
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from seqkv.errors import EvictionConfigError

if TYPE_CHECKING:
    from seqkv.trie.node import TrieNode

EvictionPolicyName = Literal["lru", "probability"]
"""The policies :func:`make_policy` builds."""


@runtime_checkable
class EvictionPolicy(Protocol):
    """Ranks evictable leaves: the lowest priority is evicted first."""

    @property
    def name(self) -> EvictionPolicyName | str: ...

    def priority(self, node: TrieNode) -> float:
        """The node's rank; it may read only the node's own fields (invariant 2)."""
        ...


class LRUPolicy:
    """Least recently used first: priority = the logical time of the node's last lookup."""

    @property
    def name(self) -> EvictionPolicyName:
        return "lru"

    def priority(self, node: TrieNode) -> float:
        return float(node.last_access)


class ProbabilityWeightedPolicy:
    """Least likely to recur first.

    The recurrence weight of a node is ``P_M(prefix) * (1 + hits)``: the model's probability of the
    whole prefix ending at the node (a prior on seeing it again), times one plus the number of
    lookups that found it stored (the evidence). The priority is its log2,
    ``path_log2_prob + log2(1 + hit_count)``. A long unique tail has a tiny ``P_M`` and no hits and
    goes first; a short probable system prompt that many sessions reached stays.
    """

    @property
    def name(self) -> EvictionPolicyName:
        return "probability"

    def priority(self, node: TrieNode) -> float:
        return node.path_log2_prob + math.log2(1 + node.hit_count)


def make_policy(name: EvictionPolicyName) -> EvictionPolicy:
    """The policy called ``name``.

    >>> make_policy("lru").name
    'lru'
    """
    if name == "lru":
        return LRUPolicy()
    if name == "probability":
        return ProbabilityWeightedPolicy()
    raise EvictionConfigError(f"unknown eviction policy {name!r}: use 'lru' or 'probability'")


class EvictionQueue:
    """A lazy min-heap of evictable leaves, ordered by a policy (invariants 1-3)."""

    __slots__ = ("_heap", "_policy", "_sequence")

    def __init__(self, policy: EvictionPolicy) -> None:
        self._policy = policy
        self._heap: list[tuple[float, int, int, TrieNode]] = []
        self._sequence = 0

    @property
    def policy(self) -> EvictionPolicy:
        return self._policy

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self._heap)

    def push(self, node: TrieNode) -> None:
        """(Re-)rank ``node``; earlier entries for it become stale."""
        node.heap_version += 1
        self._sequence += 1
        entry = (self._policy.priority(node), self._sequence, node.heap_version, node)
        heapq.heappush(self._heap, entry)

    def pop(self) -> TrieNode | None:
        """The evictable leaf of lowest priority, or ``None`` when there is none."""
        while self._heap:
            _, _, version, node = heapq.heappop(self._heap)
            if version == node.heap_version and node.evictable:
                return node
        return None

    def compact(self) -> None:
        """Drop stale entries (the trie calls this when the heap outgrows the node count)."""
        self._heap = [e for e in self._heap if e[2] == e[3].heap_version and e[3].evictable]
        heapq.heapify(self._heap)

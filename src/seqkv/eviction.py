"""Eviction, once for every cache seqkv keeps: sizes, lock references, a budget, and an order.

Motivation: seqkv keeps these caches within a byte budget: a store worker's hot tier, the radix
trie of the chains it decoded or coded (``seqkv.trie.cache``, ``seqkv.store.hot``), and its
mixing dictionaries (``seqkv.store.dictionaries``), the vLLM connector's warm tier of entry
files (``seqkv.integrations.vllm.warm_tier``), and the prefix trie's nodes (``seqkv.trie``).
Each needs the accounting of SGLang's radix cache (``mem_cache/radix_cache.py``): entries with
byte and token sizes, lock references that protect an entry while a caller uses it, evictable
and protected sizes that add up to the total, and an order in which unprotected entries go.
:class:`EvictionLedger` is that accounting and that order; a cache owns its values and tells
the ledger what changed. :class:`ByteLRU` is the ledger with the values, for the caches whose
entries are plain values (the dictionaries).

The order is a rank per entry, lowest first. ``touch`` ranks by a logical clock (least recently
used first); ``rank(key, priority)`` takes a policy's priority (:class:`LRUPolicy`,
:class:`ProbabilityWeightedPolicy`, or any :class:`EvictionPolicy`: this project's reading of
arXiv 2604.15356, layer 1, drops what the model finds least likely to recur).

Invariants:
1. ``evictable + protected == total``, in bytes and in tokens, after every operation; an entry
   is protected exactly while it holds references (``lock`` more often than ``unlock``)
   (enforced: every change of an entry's size or references moves it between the two; checked
   against a brute-force model by a hypothesis state machine, ``tests/test_eviction.py``).
2. ``evict`` never removes a protected entry, nor one the owner's ``eligible`` refuses (the
   trie's nodes with children) (enforced: every pop re-checks both).
3. Lower rank goes first; ties go to the entry ranked first (enforced by a sequence number in
   each heap entry). An entry's rank changes only through ``rank`` and ``touch``: a policy's
   priority depends only on the entry's own fields, which its owner re-ranks whenever they
   change (assumed: the ``EvictionPolicy`` contract). ``unlock`` returns an entry to the order
   at the rank it last had; an owner ranks an entry again when it becomes eligible.
4. The order is a lazy heap: re-ranking pushes a new heap entry and the older ones are skipped
   by sequence number; it holds at most ``2 x entries + 64`` heap entries after any push
   (enforced: compacted past that), so memory stays linear in the entries.
5. ``evict(n)`` frees at least ``n`` bytes unless no evictable entry is left, and stops as soon
   as it has (enforced). ``evict_to_budget`` ends within the budget unless everything over it is
   protected or ineligible (enforced).

What a call mutates: ``evict`` and ``evict_to_budget`` remove entries (and call the owner's
``on_evict`` for each, which may rank others, such as a parent that became a leaf); ``touch``,
``rank``, ``lock`` and ``unlock`` change ranks and sizes, never membership; ``sizes`` and the
properties mutate nothing. A ledger is not thread-safe: its owner holds its own lock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar, runtime_checkable

from seqkv.errors import EvictionConfigError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
E_contra = TypeVar("E_contra", contravariant=True)

EvictionPolicyName = Literal["lru", "probability"]
"""The policies :func:`make_policy` builds."""

_HEAP_SLACK = 64  # the heap is compacted when it outgrows 2 x entries + this


class Recency(Protocol):
    """An entry that knows when it was last looked up (a logical clock)."""

    @property
    def last_access(self) -> int: ...


class Recurrence(Protocol):
    """An entry that knows how likely its prefix is and how often it was found."""

    @property
    def path_log2_prob(self) -> float: ...

    @property
    def hit_count(self) -> int: ...


@runtime_checkable
class EvictionPolicy(Protocol[E_contra]):
    """Ranks entries: the lowest priority is evicted first."""

    @property
    def name(self) -> EvictionPolicyName | str: ...

    def priority(self, entry: E_contra) -> float:
        """The entry's rank; it may read only the entry's own fields (invariant 3)."""
        ...


class LRUPolicy:
    """Least recently used first: priority = the logical time of the entry's last lookup."""

    @property
    def name(self) -> EvictionPolicyName:
        return "lru"

    def priority(self, entry: Recency) -> float:
        return float(entry.last_access)


class ProbabilityWeightedPolicy:
    """Least likely to recur first.

    The recurrence weight of a prefix is ``P_M(prefix) * (1 + hits)``: the model's probability of
    the whole prefix (a prior on seeing it again), times one plus the number of lookups that found
    it stored (the evidence). The priority is its log2, ``path_log2_prob + log2(1 + hit_count)``.
    A long unique tail has a tiny ``P_M`` and no hits and goes first; a short probable system
    prompt that many sessions reached stays.
    """

    @property
    def name(self) -> EvictionPolicyName:
        return "probability"

    def priority(self, entry: Recurrence) -> float:
        return entry.path_log2_prob + math.log2(1 + entry.hit_count)


def make_policy(name: EvictionPolicyName) -> LRUPolicy | ProbabilityWeightedPolicy:
    """The policy called ``name``.

    >>> make_policy("lru").name
    'lru'
    """
    if name == "lru":
        return LRUPolicy()
    if name == "probability":
        return ProbabilityWeightedPolicy()
    raise EvictionConfigError(f"unknown eviction policy {name!r}: use 'lru' or 'probability'")


@dataclass(frozen=True, slots=True)
class EvictionSizes:
    """A ledger's sizes (invariant 1)."""

    entries: int
    evictable_bytes: int
    protected_bytes: int
    evictable_tokens: int
    protected_tokens: int

    @property
    def total_bytes(self) -> int:
        return self.evictable_bytes + self.protected_bytes

    @property
    def total_tokens(self) -> int:
        return self.evictable_tokens + self.protected_tokens


@dataclass(slots=True)
class _Entry:
    nbytes: int
    tokens: int
    refs: int = 0
    rank: float | None = None  # the rank last given; None until ranked
    queued: int = 0  # the sequence number of its live heap entry; 0: none


def _always(_: object) -> bool:
    return True


class EvictionLedger(Generic[K]):
    """Sizes, references and eviction order of a cache's entries (see the module docstring).

    >>> ledger: EvictionLedger[str] = EvictionLedger(budget_bytes=10)
    >>> for key in ("a", "b", "c"):
    ...     ledger.add(key, 4)
    ...     ledger.touch(key)
    >>> ledger.touch("a")  # now b is the least recently used
    >>> ledger.lock("b")  # and protected
    True
    >>> ledger.evict_to_budget()  # 12 bytes > 10: c goes
    (['c'], True)
    >>> ledger.sizes().protected_bytes, ledger.sizes().total_bytes
    (4, 8)
    """

    __slots__ = ("_budget", "_clock", "_eligible", "_entries", "_evictable", "_heap",
                 "_protected", "_sequence")

    def __init__(self, *, budget_bytes: int | None = None,
                 eligible: Callable[[K], bool] = _always) -> None:
        """``eligible(key)`` is the owner's own condition for a candidate (invariant 2), besides
        holding no reference; ``budget_bytes`` bounds ``evict_to_budget`` (``None``: none)."""
        self._budget = budget_bytes
        self._eligible = eligible
        self._entries: dict[K, _Entry] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._sequence = 0
        self._clock = 0
        self._evictable = [0, 0]  # bytes, tokens
        self._protected = [0, 0]

    @property
    def budget_bytes(self) -> int | None:
        return self._budget

    @budget_bytes.setter
    def budget_bytes(self, value: int | None) -> None:
        """A new budget; the next ``evict_to_budget`` applies it."""
        self._budget = value

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def total_bytes(self) -> int:
        return self._evictable[0] + self._protected[0]

    @property
    def queued(self) -> int:
        """Heap entries held, stale ones included (invariant 4)."""
        return len(self._heap)

    def sizes(self) -> EvictionSizes:
        return EvictionSizes(len(self._entries), self._evictable[0], self._protected[0],
                             self._evictable[1], self._protected[1])

    def refs(self, key: K) -> int:
        """The references ``key`` holds (0: evictable)."""
        return self._entry(key).refs

    def add(self, key: K, nbytes: int, tokens: int = 0, *, refs: int = 0) -> None:
        """Account a new entry; it has no rank (so no place in the order) until ranked."""
        if key in self._entries or nbytes < 0 or tokens < 0 or refs < 0:
            raise AssertionError(f"add of {key!r}: already held, or a negative size")
        self._entries[key] = _Entry(nbytes, tokens, refs)
        self._count(nbytes, tokens, protected=refs > 0, sign=1)

    def remove(self, key: K) -> None:
        """Forget ``key``, whatever its references (its owner dropped it)."""
        entry = self._entries.pop(key)
        self._count(entry.nbytes, entry.tokens, protected=entry.refs > 0, sign=-1)

    def resize(self, key: K, nbytes: int, tokens: int) -> None:
        entry = self._entry(key)
        self._count(entry.nbytes, entry.tokens, protected=entry.refs > 0, sign=-1)
        entry.nbytes, entry.tokens = nbytes, tokens
        self._count(nbytes, tokens, protected=entry.refs > 0, sign=1)

    def lock(self, key: K) -> bool:
        """Add a reference; True when this protected the entry."""
        entry = self._entry(key)
        entry.refs += 1
        if entry.refs == 1:
            self._count(entry.nbytes, entry.tokens, protected=False, sign=-1)
            self._count(entry.nbytes, entry.tokens, protected=True, sign=1)
            entry.queued = 0
        return entry.refs == 1

    def unlock(self, key: K) -> bool:
        """Drop a reference; True when the entry became evictable (it then goes back into the
        order at its last rank, if it is eligible)."""
        entry = self._entry(key)
        if entry.refs == 0:
            raise AssertionError(f"unlock of {key!r}, which holds no reference")
        entry.refs -= 1
        if entry.refs:
            return False
        self._count(entry.nbytes, entry.tokens, protected=True, sign=-1)
        self._count(entry.nbytes, entry.tokens, protected=False, sign=1)
        if entry.rank is not None:
            self._queue(key, entry)
        return True

    def rank(self, key: K, priority: float) -> None:
        """(Re-)rank ``key``; its older place in the order becomes stale."""
        entry = self._entry(key)
        entry.rank = priority
        self._queue(key, entry)

    def touch(self, key: K) -> None:
        """Rank ``key`` as the most recently used (LRU order)."""
        self._clock += 1
        self.rank(key, float(self._clock))

    def evict(self, num_bytes: int,
              on_evict: Callable[[K], None] | None = None) -> tuple[list[K], int]:
        """Remove evictable entries, lowest rank first, until ``num_bytes`` are freed or none is
        left: the keys removed, in order, and the bytes freed. ``on_evict(key)`` runs after each
        removal."""
        evicted: list[K] = []
        freed = 0
        while freed < num_bytes and self._heap:
            _, sequence, key = heapq.heappop(self._heap)
            if not self._live(key, sequence):
                continue
            freed += self._entries[key].nbytes
            self.remove(key)
            evicted.append(key)
            if on_evict is not None:
                on_evict(key)
        return evicted, freed

    def evict_to_budget(
        self, on_evict: Callable[[K], None] | None = None
    ) -> tuple[list[K], bool]:
        """Evict down to the budget: the keys removed, and whether the budget now holds."""
        excess = 0 if self._budget is None else self.total_bytes - self._budget
        if excess <= 0:
            return [], True
        evicted, freed = self.evict(excess, on_evict)
        return evicted, freed >= excess

    def _entry(self, key: K) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            raise AssertionError(f"{key!r} is not held by this ledger")
        return entry

    def _candidate(self, key: K, entry: _Entry) -> bool:
        return entry.refs == 0 and self._eligible(key)

    def _queue(self, key: K, entry: _Entry) -> None:
        """Push ``key`` at its rank when it is a candidate; its older heap entries go stale."""
        entry.queued = 0
        if entry.rank is None or not self._candidate(key, entry):
            return
        self._sequence += 1
        entry.queued = self._sequence
        heapq.heappush(self._heap, (entry.rank, self._sequence, key))
        if len(self._heap) > 2 * len(self._entries) + _HEAP_SLACK:
            self._heap = [(rank, sequence, held) for rank, sequence, held in self._heap
                          if self._live(held, sequence)]
            heapq.heapify(self._heap)

    def _live(self, key: K, sequence: int) -> bool:
        """Whether a heap entry is the key's current place and the key a candidate now."""
        entry = self._entries.get(key)
        return entry is not None and entry.queued == sequence and self._candidate(key, entry)

    def _count(self, nbytes: int, tokens: int, *, protected: bool, sign: int) -> None:
        sizes = self._protected if protected else self._evictable
        sizes[0] += sign * nbytes
        sizes[1] += sign * tokens


class ByteLRU(Generic[K, V]):
    """A map within a byte budget, least recently used out first; ``size`` gives an entry's
    bytes. An entry larger than the whole budget is not kept.

    >>> cache: ByteLRU[str, bytes] = ByteLRU(8, len)
    >>> cache.put("a", b"1234"); cache.put("b", b"5678")
    >>> _ = cache.get("a")  # b is now the least recently used
    >>> cache.put("c", b"90")
    >>> sorted(key for key in ("a", "b", "c") if cache.get(key) is not None)
    ['a', 'c']
    """

    def __init__(self, capacity_bytes: int, size: Callable[[V], int]) -> None:
        self._size = size
        self._values: dict[K, V] = {}
        self._ledger: EvictionLedger[K] = EvictionLedger(budget_bytes=capacity_bytes)
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return self._ledger.total_bytes

    @property
    def capacity_bytes(self) -> int:
        """The ledger's budget: the one place it is kept."""
        budget = self._ledger.budget_bytes
        assert budget is not None  # the ledger is made with an int and never changed here
        return budget

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: K) -> V | None:
        value = self._values.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._ledger.touch(key)
        return value

    def discard(self, key: K) -> None:
        """Forget ``key`` (e.g. its span was deleted)."""
        if self._values.pop(key, None) is not None:
            self._ledger.remove(key)

    def put(self, key: K, value: V) -> None:
        size = self._size(value)
        if size > self.capacity_bytes:
            return
        self.discard(key)
        self._values[key] = value
        self._ledger.add(key, size)
        self._ledger.touch(key)
        for evicted in self._ledger.evict_to_budget()[0]:
            del self._values[evicted]

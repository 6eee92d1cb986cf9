"""The trie's eviction: LRU and probability-weighted order, protection of locked paths and roots,
the ledger's heap (``seqkv.eviction``, tested on its own in ``tests/test_eviction.py``)."""

from __future__ import annotations

import math

import pytest

from seqkv.errors import EvictionConfigError
from seqkv.trie import (
    EvictionPolicy,
    LRUPolicy,
    PrefixTrie,
    ProbabilityWeightedPolicy,
    make_policy,
)
from seqkv.trie.errors import TrieConfigError
from seqkv.trie.node import TrieNode


def ones(n: int, bits: float = 1.0) -> list[float]:
    return [-bits] * n


class OldestFirst:
    """A policy written against the protocol: first created, first evicted (FIFO)."""

    @property
    def name(self) -> str:
        return "fifo"

    def priority(self, node: TrieNode) -> float:
        return float(node.created)


def test_lru_evicts_the_least_recently_used_leaf_first() -> None:
    trie = PrefixTrie(nominal_kv_bytes_per_token=1)
    for head in (1, 2, 3):
        trie.insert([head, 0, 0], ones(3), lock=False)
    trie.match([1, 0, 0])  # 1 is now the most recent
    assert len(trie.evict(6).evicted) == 2
    assert trie.match([2, 0, 0]).length == 0
    assert trie.match([3, 0, 0]).length == 0
    assert trie.match([1, 0, 0]).length == 3


def test_lru_order_is_reported() -> None:
    trie = PrefixTrie(nominal_kv_bytes_per_token=1)
    hashes = [trie.insert([head, 0], ones(2), lock=False).prefix_hash for head in (1, 2, 3)]
    trie.match([2, 0])
    assert [e.prefix_hash for e in trie.evict(10**6).evicted] == [hashes[0], hashes[2], hashes[1]]


def test_probability_weighted_evicts_the_least_likely_first() -> None:
    trie = PrefixTrie(policy="probability", nominal_kv_bytes_per_token=1)
    likely = trie.insert([1, 1], ones(2, 0.1), lock=False).prefix_hash
    unlikely = trie.insert([2, 2], ones(2, 8.0), lock=False).prefix_hash
    middle = trie.insert([3, 3], ones(2, 2.0), lock=False).prefix_hash
    assert [e.prefix_hash for e in trie.evict(10**6).evicted] == [unlikely, middle, likely]


def test_probability_weighted_counts_hits_as_evidence() -> None:
    trie = PrefixTrie(policy="probability", nominal_kv_bytes_per_token=1)
    a = trie.insert([1, 1], ones(2, 2.0), lock=False).prefix_hash  # P = 2^-4
    b = trie.insert([2, 2], ones(2, 1.5), lock=False).prefix_hash  # P = 2^-3
    for _ in range(3):
        trie.match([1, 1])  # weight of a: 2^-4 x (1 + 3) = 2^-2 > 2^-3
    assert [e.prefix_hash for e in trie.evict(10**6).evicted] == [b, a]


def test_priorities() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2], [-1.0, -2.0])
    trie.match([1, 2])
    node = trie._index[trie.match([1, 2]).prefix_hash]
    assert LRUPolicy().priority(node) == node.last_access
    assert ProbabilityWeightedPolicy().priority(node) == pytest.approx(-3.0 + math.log2(1 + 2))


def test_a_custom_policy_follows_the_protocol() -> None:
    policy = OldestFirst()
    assert isinstance(policy, EvictionPolicy)
    trie = PrefixTrie(policy=policy, nominal_kv_bytes_per_token=1)
    first = trie.insert([1], ones(1), lock=False).prefix_hash
    trie.insert([2], ones(1), lock=False)
    trie.match([1])  # recency does not matter to FIFO
    assert trie.evict(1).evicted[0].prefix_hash == first


def test_locked_paths_and_roots_are_never_evicted() -> None:
    trie = PrefixTrie(nominal_kv_bytes_per_token=1)
    trie.insert([1, 2, 3], ones(3))
    trie.insert([1, 2, 4, 5], ones(4), lock=False)
    result = trie.evict(10**6)
    assert not result.satisfied
    assert [(e.start, e.end) for e in result.evicted] == [(2, 4)]
    assert trie.match([1, 2, 3]).length == 3
    assert trie.sizes().nodes == 3  # root, [1, 2], [3]
    assert trie.audit().evictable_leaves == 0


def test_eviction_cascades_to_parents_that_become_leaves() -> None:
    trie = PrefixTrie(nominal_kv_bytes_per_token=1)
    trie.insert([1, 2, 3], ones(3), lock=False)
    trie.insert([1, 2, 4], ones(3), lock=False)
    result = trie.evict(3)
    assert [(e.start, e.end) for e in result.evicted] == [(2, 3), (2, 3), (0, 2)]
    assert trie.sizes().total_tokens == 0
    assert trie.sizes().nodes == 1


def test_evict_zero_bytes_evicts_nothing() -> None:
    trie = PrefixTrie(nominal_kv_bytes_per_token=1)
    trie.insert([1], ones(1), lock=False)
    assert trie.evict(0).evicted == ()


def test_the_queue_stays_bounded_under_many_touches() -> None:
    trie = PrefixTrie(nominal_kv_bytes_per_token=1)
    trie.insert([1, 2], ones(2), lock=False)
    for _ in range(1000):
        trie.match([1, 2])
    assert trie._ledger.queued <= 2 * len(trie._ledger) + 64


def test_unknown_policy_name() -> None:
    with pytest.raises(TrieConfigError, match="unknown eviction policy"):
        PrefixTrie(policy="mru")  # type: ignore[arg-type]
    with pytest.raises(EvictionConfigError, match="unknown eviction policy"):
        make_policy("mru")  # type: ignore[arg-type]

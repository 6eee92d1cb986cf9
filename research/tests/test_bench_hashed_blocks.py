"""The vLLM-style baseline: full blocks only, chained hashes, ref counts, LRU free queue."""

from __future__ import annotations

import numpy as np
import pytest

from research.bench.hashed_blocks import (
    Block,
    BlockId,
    BlockSessionId,
    HashedBlockCache,
    block_hashes,
)
from seqkv.trie import Namespace, UnknownSessionError
from seqkv.trie.errors import TrieConfigError


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_only_full_blocks_are_shared() -> None:
    cache = HashedBlockCache(block_size=16, bytes_per_token=1)
    cache.allocate(seq(40))
    second = cache.allocate([*seq(35), 999, 998, 997, 996, 995])
    assert second.hit_tokens == 32  # 35 shared tokens, two full blocks
    assert second.blocks == 3


def test_a_partial_block_is_private_and_freed_on_release() -> None:
    cache = HashedBlockCache(block_size=16, bytes_per_token=1)
    first = cache.allocate(seq(20))
    assert cache.stats().used_blocks == 2
    cache.release(first.session)
    stats = cache.stats()
    assert (stats.used_blocks, stats.cached_blocks, stats.bytes_stored) == (1, 1, 16)
    assert cache.match(seq(20)) == 16


def test_hashes_chain_through_the_parent() -> None:
    a = block_hashes(np.array(seq(32), dtype=np.int64), 16, Namespace(""))
    b = block_hashes(np.array([99, *seq(31, 1)], dtype=np.int64), 16, Namespace(""))
    assert a[1] != b[1]  # same second-block tokens, different parents


def test_namespaces_enter_the_chain() -> None:
    cache = HashedBlockCache(block_size=4, bytes_per_token=1)
    cache.allocate(seq(8), namespace=Namespace("a"))
    assert cache.match(seq(8), namespace=Namespace("b")) == 0
    assert cache.match(seq(8), namespace=Namespace("a")) == 8


def test_lru_free_queue_evicts_tail_blocks_first() -> None:
    cache = HashedBlockCache(block_size=4, capacity_blocks=3, bytes_per_token=1)
    first = cache.allocate(seq(12))
    cache.release(first.session)  # blocks freed tail first: queue = [2, 1, 0]
    second = cache.allocate(seq(4, 100))  # needs one block: evicts block 2 (the tail)
    assert second.evicted_blocks == 1
    assert cache.match(seq(12)) == 8


def test_allocation_beyond_capacity_when_everything_is_referenced() -> None:
    cache = HashedBlockCache(block_size=4, capacity_blocks=1, bytes_per_token=1)
    first = cache.allocate(seq(8))
    assert cache.stats().over_capacity_blocks == 1
    cache.release(first.session)
    assert cache.stats().used_blocks == 1


def test_budget_in_bytes() -> None:
    cache = HashedBlockCache.with_budget(16 * 10 * 3, bytes_per_token=10, block_size=16)
    for start in range(0, 400, 100):
        cache.release(cache.allocate(seq(48, start)).session)
    assert cache.stats().bytes_stored <= 16 * 10 * 3


def test_match_mutates_nothing() -> None:
    cache = HashedBlockCache(block_size=4, bytes_per_token=1)
    cache.allocate(seq(8))
    before = cache.stats()
    assert cache.match(seq(9)) == 8
    assert cache.stats() == before


def test_blocks_have_no_instance_dict() -> None:
    assert not hasattr(Block(block_id=BlockId(1), block_hash=None), "__dict__")


def test_release_of_an_unknown_session() -> None:
    with pytest.raises(UnknownSessionError, match="not held"):
        HashedBlockCache(bytes_per_token=1).release(BlockSessionId(3))


def test_bad_block_size() -> None:
    with pytest.raises(TrieConfigError, match="block_size"):
        HashedBlockCache(block_size=0, bytes_per_token=1)

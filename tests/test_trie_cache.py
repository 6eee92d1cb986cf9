"""``seqkv.trie.cache.RadixCache``, the store's prefix index and hot tier: a hypothesis state
machine against a brute-force model (the list of inserted sequences), then one test per guard,
each with the mutant that proves it catches its defect."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import seqkv.trie.cache as cache_module
from seqkv.eviction import EvictionLedger
from seqkv.trie.cache import CacheNode, RadixCache

NS = "ns"


@dataclass(frozen=True)
class Chain:
    """A source whose cut is its tokens' prefix (all chains agree where their tokens do), or
    its name (chains agree on nothing) when ``own`` is set."""

    tokens: tuple[int, ...]
    own: str = ""

    def cut(self, length: int) -> Hashable:
        return (self.own, self.tokens[:length]) if self.own else self.tokens[:length]


def kv_of(tokens: Sequence[int], mark: float = 0.0) -> torch.Tensor:
    """A KV whose value at position ``j`` depends only on ``tokens[: j + 1]`` (and ``mark``)."""
    values = [float(hash(tuple(tokens[: j + 1])) % 1000) + mark for j in range(len(tokens))]
    return torch.tensor(values).reshape(1, 1, 1, len(tokens), 1).expand(1, 2, 1, -1, 2).clone()


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _nodes(cache: RadixCache[Chain]) -> list[CacheNode[Chain]]:
    out: list[CacheNode[Chain]] = []
    stack = [child for root in cache._roots.values() for child in root.children.values()]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


sequences = st.lists(st.integers(0, 3), min_size=1, max_size=8).map(tuple)


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache: RadixCache[Chain] = RadixCache(budget_bytes=None)
        self.inserted: list[tuple[int, ...]] = []
        self.locks: list[tuple[tuple[int, ...], CacheNode[Chain]]] = []
        self.evicted = False

    @rule(tokens=sequences)
    def insert(self, tokens: tuple[int, ...]) -> None:
        self.cache.insert(NS, tokens, kv_of(tokens), Chain(tokens), tag=tokens)
        self.inserted.append(tokens)

    @rule(query=sequences)
    def match(self, query: tuple[int, ...]) -> None:
        found = self.cache.match_prefix(NS, query)
        longest = max((_common(query, s) for s in self.inserted), default=0)
        assert found.tokens == query[: found.length]
        assert found.length <= longest
        if not self.evicted:
            assert found.length == longest
        if found.length:
            assert found.kv is not None and torch.equal(found.kv, kv_of(query[: found.length]))

    @rule(query=sequences)
    def lock(self, query: tuple[int, ...]) -> None:
        found = self.cache.match_prefix(NS, query)
        if found.node is not None:
            self.cache.lock(found.node)
            self.locks.append((found.tokens, found.node))

    @precondition(lambda self: self.locks)
    @rule()
    def unlock(self) -> None:
        _, node = self.locks.pop()
        self.cache.unlock(node)

    @rule(num_bytes=st.integers(0, 400))
    def evict(self, num_bytes: int) -> None:
        self.cache.evict(num_bytes)
        self.evicted = True

    @invariant()
    def locked_paths_and_tags_stay(self) -> None:
        for tokens, _ in self.locks:
            assert self.cache.match_prefix(NS, tokens).length == len(tokens)
        for tokens in set(self.inserted):
            found = self.cache.find(NS, tokens)
            assert found is None or found.tokens == tokens

    @invariant()
    def sizes_add_up(self) -> None:
        nodes = _nodes(self.cache)
        sizes = self.cache.sizes()
        assert sizes.total_bytes == sum(n.nbytes for n in nodes)
        assert sizes.total_tokens == sum(len(n.tokens) for n in nodes)
        protected = [n for n in nodes if self.cache._ledger.refs(n)]
        assert sizes.protected_bytes == sum(n.nbytes for n in protected)
        if not self.locks:
            assert sizes.protected_bytes == 0


TestCacheMachine = CacheMachine.TestCase


def test_nodes_are_slotted() -> None:
    node: CacheNode[Chain] = CacheNode(None, (), None, 0, source=None)
    assert not hasattr(node, "__dict__")


def _budget_run() -> list[int]:
    cache: RadixCache[Chain] = RadixCache(budget_bytes=600)
    totals = []
    for i in range(30):
        tokens = tuple((i * 7 + j * 3) % 11 for j in range(3 + i % 5))
        cache.insert(NS, tokens, kv_of(tokens), Chain(tokens))
        totals.append(cache.nbytes)
    return totals


def test_the_budget_holds_after_every_insert() -> None:
    assert max(_budget_run()) <= 600


def test_the_budget_test_catches_a_cache_that_does_not_evict(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EvictionLedger, "evict_to_budget", lambda self, on_evict=None: ([], True))
    assert max(_budget_run()) > 600


def _lock_run() -> tuple[int, int]:
    """A locked match survives inserts far over the budget; released, it is evicted."""
    cache: RadixCache[Chain] = RadixCache(budget_bytes=200)
    kept = (1, 2, 3, 4)
    cache.insert(NS, kept, kv_of(kept), Chain(kept))
    found = cache.match_prefix(NS, kept)
    assert found.node is not None
    cache.lock(found.node)
    for i in range(10):
        other = (9, i, i, i, i)
        cache.insert(NS, other, kv_of(other), Chain(other))
    while_locked = cache.match_prefix(NS, kept).length
    cache.unlock(found.node)
    for i in range(10):
        other = (8, i, i, i, i)
        cache.insert(NS, other, kv_of(other), Chain(other))
    return while_locked, cache.match_prefix(NS, kept).length


def test_a_lock_protects_from_eviction() -> None:
    assert _lock_run() == (4, 0)


def test_the_lock_test_catches_a_lock_that_protects_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RadixCache, "lock", lambda self, node: None)
    monkeypatch.setattr(RadixCache, "unlock", lambda self, node: None)
    assert _lock_run()[0] < 4


def _mixed_match() -> tuple[int, str]:
    """Two chains with the same first tokens but KV that differs (another chain of spans):
    a match through both returns one chain's tokens and KV only."""
    cache: RadixCache[Chain] = RadixCache(budget_bytes=None)
    first, second = (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)
    cache.insert(NS, first, kv_of(first), Chain(first, own="A"))
    cache.insert(NS, second, kv_of(second, mark=0.5), Chain(second, own="B"))
    found = cache.match_prefix(NS, second)
    assert found.kv is not None and found.source is not None
    marks = {float(v) % 1 for v in found.kv.flatten()}
    assert len(marks) == 1, "the KV mixes two chains"
    return found.length, found.source.own


def test_a_match_never_mixes_two_chains_kv() -> None:
    assert _mixed_match() == (4, "A")


def test_the_mixing_test_catches_a_match_that_ignores_sources(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "_agree", lambda node, source, length=None: True)
    with pytest.raises(AssertionError, match="mixes two chains"):
        _mixed_match()


def test_a_chain_disagreeing_with_the_held_path_adds_nothing() -> None:
    """A leaf under another chain's KV could never be matched: it would only take budget."""
    cache: RadixCache[Chain] = RadixCache(budget_bytes=None)
    first, longer = (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)
    cache.insert(NS, first, kv_of(first), Chain(first, own="A"))
    held = cache.nbytes
    assert cache.insert(NS, longer, kv_of(longer, mark=0.5), Chain(longer, own="B")) is None
    assert cache.nbytes == held
    match = cache.match_prefix(NS, longer)
    assert match.length == 4 and match.source == Chain(first, own="A")

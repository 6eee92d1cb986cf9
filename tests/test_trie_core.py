"""``seqkv.trie.core``: one radix trie under ``PrefixTrie`` and ``RadixCache``; the ledger's
rank kept current (core invariant 4), one heap entry per release, and the budget read from the
ledger. Each guard has a mutant beside it that the test catches."""

from __future__ import annotations

import pytest
import torch

from seqkv.trie import PrefixTrie, RadixCache
from seqkv.trie.cache import CacheNode
from seqkv.trie.core import RadixNode, RadixTree
from seqkv.trie.node import TrieNode

SHARED = ("_walk", "_split", "_attach", "_touch", "_rank", "_lock_path", "_unlock_path",
          "_evict", "_evict_to_budget", "_remove")


class Chain(tuple[int, ...]):
    def cut(self, length: int) -> tuple[int, ...]:
        return self[:length]


def test_both_tries_sit_on_the_one_core() -> None:
    for owner in (PrefixTrie, RadixCache):
        assert issubclass(owner, RadixTree)
        redefined = [name for name in SHARED if name in vars(owner)]
        assert redefined == [], f"{owner.__name__} walks, splits or evicts on its own"
    assert issubclass(TrieNode, RadixNode) and issubclass(CacheNode, RadixNode)


def test_nodes_of_both_stay_slotted() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2, 3], [-1.0] * 3)
    trie.match([1, 2])  # a split: the upper node is made by the core's hook
    cache: RadixCache[Chain] = RadixCache(budget_bytes=None)
    cache.insert("ns", (1, 2, 3), None, Chain((1, 2, 3)))
    cache.insert("ns", (1, 2, 9), None, Chain((1, 2, 9)))
    nodes = [*trie._index.values(), *cache._roots["ns"].children.values()]
    assert len(nodes) >= 4
    for node in nodes:
        assert not hasattr(node, "__dict__")


def _release_pushes(trie: PrefixTrie) -> int:
    """Heap entries a release of a locked leaf adds."""
    session = trie.insert([1, 2, 3], [-1.0] * 3).session
    assert session is not None
    before = trie._ledger.queued
    trie.release(session)
    return trie._ledger.queued - before


def test_a_release_queues_each_freed_leaf_once() -> None:
    assert _release_pushes(PrefixTrie(nominal_kv_bytes_per_token=1)) == 1


def test_the_release_test_catches_a_second_rank_after_unlock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def unlock_then_rank(self: PrefixTrie, node: TrieNode) -> None:
        for step in reversed([node, *_ancestors(node)]):
            if self._ledger.unlock(step):
                self._rank(step)

    monkeypatch.setattr(PrefixTrie, "_unlock_path", unlock_then_rank)
    assert _release_pushes(PrefixTrie(nominal_kv_bytes_per_token=1)) == 2


def _ancestors(node: TrieNode) -> list[TrieNode]:
    out = []
    current = node.parent
    while current is not None and current.parent is not None:
        out.append(current)
        current = current.parent
    return out


def _survivor_after_hits_while_locked() -> tuple[int, ...]:
    """A likely leaf and a less likely one that is locked, found three times, then released:
    under the probability-weighted policy its hits (log2 4 = 2 bits) now outweigh its
    1 bit of extra surprisal, so the other leaf must go first."""
    trie = PrefixTrie(policy="probability", nominal_kv_bytes_per_token=1)
    trie.insert([2, 2], [-1.0, -1.0], lock=False)
    held = trie.insert([1, 1], [-1.5, -1.5]).session
    assert held is not None
    for _ in range(3):
        trie.match([1, 1])
    trie.release(held)
    assert len(trie.evict(1).evicted) == 1
    return tuple(head for head in (1, 2) if trie.match([head, head]).length == 2)


def test_a_released_node_goes_back_at_its_current_rank() -> None:
    assert _survivor_after_hits_while_locked() == (1,)


def test_the_rank_test_catches_a_touch_that_skips_locked_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    original = RadixTree._rank

    def rank_candidates_only(self: RadixTree[TrieNode], node: TrieNode) -> None:
        if self._refs(node) == 0:
            original(self, node)

    monkeypatch.setattr(RadixTree, "_rank", rank_candidates_only)
    assert _survivor_after_hits_while_locked() == (2,)


def _budget_seen_after_the_ledger_changes(trie: PrefixTrie) -> int | None:
    trie._ledger.budget_bytes = 7
    return trie.budget_bytes


def test_the_budget_is_read_from_the_ledger() -> None:
    assert _budget_seen_after_the_ledger_changes(PrefixTrie(budget_bytes=100)) == 7


def test_the_budget_test_catches_a_copied_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    copies: dict[int, int | None] = {}
    original_init = PrefixTrie.__init__

    def init_copying(self: PrefixTrie, **kwargs: object) -> None:
        original_init(self, **kwargs)  # type: ignore[arg-type]
        copies[id(self)] = self._ledger.budget_bytes

    monkeypatch.setattr(PrefixTrie, "__init__", init_copying)
    monkeypatch.setattr(PrefixTrie, "budget_bytes", property(lambda self: copies[id(self)]))
    assert _budget_seen_after_the_ledger_changes(PrefixTrie(budget_bytes=100)) == 100


def _node_storage(owner: type[RadixTree]) -> list[tuple[int, int]]:
    """(storage bytes, KV bytes) of every node's KV after inserting two diverging sequences
    whose KV is one slice of a larger tensor."""
    base = torch.randn(2, 2, 3, 40, 4)
    kv = base[:, :, :, 5:17, :]  # a view into 40 positions
    if owner is PrefixTrie:
        trie = PrefixTrie()
        trie.insert(list(range(12)), [-1.0] * 12, kv)
        trie.insert([*range(6), 99, 98], [-1.0] * 8, torch.randn(2, 2, 3, 8, 4))
        tree: RadixTree = trie
    else:
        cache: RadixCache[Chain] = RadixCache(budget_bytes=None)
        cache.insert("n", list(range(12)), kv, Chain(range(12)))
        cache.insert("n", [*range(6), 99, 98], torch.randn(2, 2, 3, 8, 4),
                     Chain([*range(6), 99, 98]))
        tree = cache
    stack = list(tree._roots.values())
    nodes = []
    while stack:
        node = stack.pop()
        stack += node.children.values()
        if node.kv is not None:
            nodes.append(node)
    assert len(nodes) >= 3  # the shared edge and two tails
    return [(n.kv.untyped_storage().nbytes(), n.kv.nbytes) for n in nodes]


@pytest.mark.parametrize("owner", [PrefixTrie, RadixCache])
def test_a_nodes_kv_owns_exactly_its_own_bytes(owner: type[RadixTree]) -> None:
    """Invariant 6: a node's KV is an owned copy of its edge, so the budget's byte count is the
    memory it holds (a view would keep the caller's whole tensor alive)."""
    assert all(storage == held for storage, held in _node_storage(owner))


def test_the_ownership_test_catches_a_view(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RadixTree, "_copy_kv",
                        lambda self, kv, start, stop: kv[:, :, :, start:stop, :])
    assert any(storage > held for storage, held in _node_storage(RadixCache))

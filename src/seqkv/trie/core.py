"""``RadixTree``: the one radix trie of ``seqkv.trie``, under both of its caches.

Motivation: the store's hot tier (``seqkv.trie.cache.RadixCache``) and the probabilistic prefix
trie of layer 1 (``seqkv.trie.radix.PrefixTrie``) are both path-compressed radix tries over token
ids with KV per edge, lock references and eviction of unreferenced leaves within a byte budget
(SGLang's ``mem_cache/radix_cache.py``). Walking, splitting, adding leaves, locking, ranking and
evicting are written here once; an owner adds what its nodes carry (a source chain and tags; or
log2-probabilities, a prefix hash and statistics) through four hooks: ``_upper`` (the payload of
the upper half of a split edge), ``_nbytes`` (what a node costs in the budget), ``_priority`` (its
eviction rank: the ledger's order is ``seqkv.eviction``'s) and ``_forget`` (the owner's own
bookkeeping of a removed node).

Invariants:
1. A node's ``depth`` is its parent's plus ``len(tokens)``; only a root has an empty edge, and a
   parent files each child under the child's first token (enforced: ``_split`` and ``_attach``
   are the only places that link nodes; owners' audits check it).
2. ``evictable + protected == total`` in bytes and tokens (``seqkv.eviction`` invariant 1); a
   node is protected while a lock on it or on a node below it is held (enforced: ``_lock_path``
   references the whole path to the root, and a split gives the new upper node the references of
   the node it splits).
3. Only unreferenced live leaves are evicted, never a root (enforced: the ledger's ``eligible``
   is "a live leaf", and roots are not in the ledger).
4. A node's rank in the ledger is its ``_priority`` as of its last change: every node a call
   touches, splits off or turns into a leaf is ranked again (enforced), so ``unlock`` puts a node
   back at its current rank and nobody ranks it a second time (one heap entry per candidate).
5. Nodes are never merged, and a split keeps the lower node's identity, depth and payload end
   (enforced: no code path merges), so a node handed out stays the end of the same prefix until
   it is evicted.
6. KV tensors are never written after a node holds them; a split replaces the edge's tensor by
   two new ones (enforced: ``_copy_kv`` copies), so a tensor handed out stays valid.

What a call mutates: ``_walk(split=True)`` may split one edge; ``_walk(split=False)`` nothing;
``_attach`` adds one leaf; ``_touch`` stamps and re-ranks a path; ``_lock_path``/``_unlock_path``
move nodes between protected and evictable; ``_evict``, ``_evict_to_budget`` and ``_remove``
remove leaves. A tree is not thread-safe: its owner serializes calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from seqkv.eviction import EvictionLedger

TOKEN_AXIS = 3  # [layers, 2, kv_heads, tokens, head_dim]

N = TypeVar("N", bound="RadixNode[Any]")


@dataclass(slots=True, eq=False)
class RadixNode(Generic[N]):
    """One edge of tokens and its KV; compares by identity (a dict and ledger key).

    Owners subclass it with their payload (keyword-only fields); ``N`` is the subclass itself.
    """

    parent: N | None
    tokens: tuple[int, ...]  # [edge]
    kv: torch.Tensor | None  # [layers, 2, kv_heads, edge, head_dim]; None: not held
    depth: int  # tokens from the root to the end of this edge
    children: dict[int, N] = field(default_factory=dict)
    last_access: int = 0  # the owner's logical clock at the last lookup through this node
    alive: bool = True  # False once removed

    @property
    def start(self) -> int:
        """Depth at which this node's edge starts."""
        return self.depth - len(self.tokens)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixTree(ABC, Generic[N]):
    """Roots per namespace, the ledger, a logical clock, and the operations on them (see the
    module docstring); an owner subclasses it and implements the hooks."""

    def __init__(self, *, budget_bytes: int | None) -> None:
        self._ledger: EvictionLedger[N] = EvictionLedger(budget_bytes=budget_bytes,
                                                         eligible=_is_live_leaf)
        self._roots: dict[Hashable, N] = {}
        self._clock = 0

    @property
    def budget_bytes(self) -> int | None:
        """The ledger's budget: the one place it is kept."""
        return self._ledger.budget_bytes

    @abstractmethod
    def _upper(self, child: N, at: int, kv: torch.Tensor | None, query: Sequence[int]) -> N:
        """A new node for ``child``'s first ``at`` tokens and ``kv`` (their KV), with
        ``child``'s parent and the payload of those tokens; trims ``child``'s own payload to
        its remaining edge. ``query`` starts with the tokens of the new node's whole prefix.
        The core relinks the nodes and fixes their sizes afterwards."""

    @abstractmethod
    def _nbytes(self, node: N) -> int:
        """What ``node`` costs in the budget."""

    def _priority(self, node: N) -> float:
        """``node``'s eviction rank, lowest first, from its own fields (invariant 4)."""
        return float(node.last_access)

    def _forget(self, node: N) -> None:
        """The owner's bookkeeping of a node just removed (it is already unlinked)."""

    def _copy_kv(self, kv: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """An owned, contiguous copy of ``kv[:, :, :, start:stop, :]`` (invariant 6)."""
        # one copy: ``clone`` into contiguous memory owns its storage, so a node's KV never
        # keeps the caller's whole tensor alive
        return kv[:, :, :, start:stop, :].clone(memory_format=torch.contiguous_format)

    def _walk(self, root: N, query: Sequence[int], *, split: bool) -> tuple[list[N], int]:
        """The nodes matching ``query`` from ``root`` (excluded) and the tokens matched.

        With ``split=True`` an edge the match ends inside is split there, so the path ends at a
        node boundary; with ``split=False`` nothing changes and the last node of the path may be
        matched only in part (``position < path[-1].depth``).
        """
        path: list[N] = []
        node, position = root, 0
        while position < len(query):
            child = node.children.get(query[position])
            if child is None:
                break
            shared = common_length(child.tokens, query, position)
            if shared < len(child.tokens):
                if split:
                    child = self._split(child, shared, query)
                path.append(child)
                position += shared
                break
            path.append(child)
            node, position = child, position + shared
        return path, position

    def _split(self, child: N, at: int, query: Sequence[int]) -> N:
        """Put a node holding ``child``'s first ``at`` tokens between it and its parent;
        ``child`` keeps its identity, depth and the rest of its payload (invariant 5)."""
        parent = child.parent
        if parent is None or not 0 < at < len(child.tokens):
            raise AssertionError(f"split of a root or outside its edge (at={at})")
        edge = len(child.tokens)
        upper_kv = None if child.kv is None else self._copy_kv(child.kv, 0, at)
        lower_kv = None if child.kv is None else self._copy_kv(child.kv, at, edge)
        upper = self._upper(child, at, upper_kv, query)
        child.tokens = child.tokens[at:]
        child.kv = lower_kv
        child.parent = upper
        upper.children[child.tokens[0]] = child
        parent.children[upper.tokens[0]] = upper
        self._ledger.resize(child, self._nbytes(child), len(child.tokens))
        self._ledger.add(upper, self._nbytes(upper), at, refs=self._ledger.refs(child))
        self._rank(upper)
        return upper

    def _attach(self, leaf: N) -> N:
        """File a new leaf under its parent and in the ledger (unreferenced, unranked until
        touched)."""
        parent = leaf.parent
        if parent is None or not leaf.tokens or leaf.tokens[0] in parent.children:
            raise AssertionError("a leaf needs a parent, an edge, and a free first token")
        parent.children[leaf.tokens[0]] = leaf
        self._ledger.add(leaf, self._nbytes(leaf), len(leaf.tokens))
        return leaf

    def _resize(self, node: N) -> None:
        """Tell the ledger ``node``'s size changed (e.g. KV attached to it)."""
        self._ledger.resize(node, self._nbytes(node), len(node.tokens))

    def _touch(self, path: Sequence[N]) -> None:
        """Stamp ``path`` with the clock and rank it again (invariant 4)."""
        for node in path:
            node.last_access = self._clock
            self._rank(node)

    def _rank(self, node: N) -> None:
        self._ledger.rank(node, self._priority(node))

    def _lock_path(self, node: N) -> None:
        for step in path_to(node):
            self._ledger.lock(step)

    def _unlock_path(self, node: N) -> None:
        """Release one ``_lock_path(node)``; a node that becomes evictable goes back into the
        order at its rank, which is current (invariant 4)."""
        for step in path_to(node):
            self._ledger.unlock(step)

    def _refs(self, node: N) -> int:
        """The locks held on ``node`` (a root holds none)."""
        return 0 if node.parent is None else self._ledger.refs(node)

    def _evict(self, num_bytes: int) -> tuple[list[N], int]:
        """Remove unreferenced leaves, lowest rank first, until ``num_bytes`` are freed or none
        is left: the nodes removed, in order, and the bytes freed."""
        return self._ledger.evict(num_bytes, self._remove)

    def _evict_to_budget(self) -> tuple[list[N], bool]:
        """Evict down to the budget: the nodes removed, and whether the budget now holds."""
        return self._ledger.evict_to_budget(self._remove)

    def _remove(self, node: N) -> None:
        """Unlink a leaf the ledger has let go, or that its owner dropped (invariant 3)."""
        parent = node.parent
        if parent is None or not node.alive or node.children:
            raise AssertionError("eviction reached a node that is not a live leaf")
        if node in self._ledger:
            self._ledger.remove(node)
        del parent.children[node.tokens[0]]
        node.alive, node.kv, node.parent = False, None, None
        self._forget(node)
        if parent.parent is not None and not parent.children:
            self._rank(parent)


def _is_live_leaf(node: RadixNode[Any]) -> bool:
    return node.alive and not node.children


def common_length(edge: tuple[int, ...], query: Sequence[int], position: int) -> int:
    """How many of ``edge``'s tokens ``query`` repeats from ``position`` on.

    >>> common_length((3, 4, 5), (1, 3, 4, 9), 1)
    2
    """
    stop = position + len(edge)
    if edge == tuple(query[position:stop]):
        return len(edge)
    shared = 0
    for a, b in zip(edge, query[position:stop], strict=False):
        if a != b:
            break
        shared += 1
    return shared


def path_to(node: N) -> list[N]:
    """The path from the root (excluded) to ``node`` (last)."""
    path: list[N] = []
    current: N | None = node
    while current is not None and current.parent is not None:
        path.append(current)
        current = current.parent
    path.reverse()
    return path

"""``RadixCache``: a store worker's in-memory prefix index and hot tier, as a radix trie.

Motivation: a store put, append or get needs the tokens and KV of the longest stored prefix of a
session. Looking that prefix up in the backend's index costs a request, and decoding its chain
costs model forwards; the prefixes a worker decoded or coded are kept here, so the next lookup
finds them in memory, token by token. The shape is SGLang's ``BasePrefixCache``
(``mem_cache/radix_cache.py``): ``match_prefix`` returns a match result, ``insert``, ``evict``,
``lock``/``unlock`` references, evictable and protected sizes; the budget and order are
``seqkv.eviction``'s.

Each node holds one edge of tokens, the KV of that edge, and its *source*: the stored chain
(opaque here, a ``ChainSource``) whose decode gave those tokens and that KV. Two chains may hold
the same tokens with KV that is not bit-identical (coded by different levels or workers), so a
match is cut where the path's sources stop agreeing: every node of a returned path has a source
whose chain, cut at the node's end, is the matched source's chain cut there (``cut``). The KV
of a match is then exactly the KV of its source's chain.

Invariants:
1. A match's tokens equal the query's first ``length`` tokens (enforced: compared token by
   token while walking), and its KV is the concatenation of the edges' KV of one chain
   (enforced by the source check above).
2. ``evictable + protected == total`` in bytes and tokens (``seqkv.eviction`` invariant 1);
   a node is protected while a ``lock`` on it or on a node below it is not released (enforced:
   ``lock`` references the whole path to the root; a split gives the new upper node the
   references of the node it splits).
3. Only unreferenced leaves are evicted, never a root (enforced: the ledger's ``eligible`` is
   "a live leaf", and roots are not in the ledger). After every ``insert`` the total is within
   the budget unless everything over it is protected (enforced: ``evict_to_budget``).
4. A tag names the node that ends exactly at the tagged chain's last token, and only when the
   whole path to it agrees with that chain (enforced at ``insert``; a node keeps its depth and
   source through splits, and a tag goes with its node when it is evicted).

What a call mutates: ``insert`` may split one edge, adds at most one leaf, re-ranks its path and
evicts down to the budget; ``match_prefix`` and ``find`` re-rank the path they return and
nothing else (no split: a match may end inside an edge); ``lock``/``unlock`` move nodes between
protected and evictable; ``evict``, ``drop`` remove nodes; ``sizes`` mutates nothing. A cache is
not thread-safe: its owner serializes calls (a ``SessionStore`` serves one thread).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import torch

from seqkv.eviction import EvictionLedger, EvictionSizes

_TOKEN_AXIS = 3  # [layers, 2, kv_heads, tokens, head_dim]
_TOKEN_BYTES = 8  # what one token costs in the budget, besides its KV


class ChainSource(Protocol):
    """What a node remembers of the stored chain that gave its tokens and KV."""

    def cut(self, length: int) -> Hashable:
        """The identity of the chain's first ``length`` tokens: equal cuts have equal tokens
        and bit-identical KV over them (assumed: the owner's contract)."""
        ...


S = TypeVar("S", bound=ChainSource)


@dataclass(slots=True, eq=False)
class CacheNode(Generic[S]):
    """One edge of tokens, its KV and its source; compares by identity (a dict key)."""

    parent: CacheNode[S] | None
    tokens: tuple[int, ...]  # [edge]
    kv: torch.Tensor | None  # [layers, 2, kv_heads, edge, head_dim]; None: a tokens-only chain
    source: S | None  # None only for a root
    depth: int  # tokens from the root to the end of this edge
    children: dict[int, CacheNode[S]] = field(default_factory=dict)
    tags: list[tuple[Hashable, Hashable]] = field(default_factory=list)  # chains ending here
    last_access: int = 0
    alive: bool = True

    @property
    def start(self) -> int:
        return self.depth - len(self.tokens)

    @property
    def nbytes(self) -> int:
        return _TOKEN_BYTES * len(self.tokens) + (0 if self.kv is None else self.kv.nbytes)


@dataclass(frozen=True)
class CacheMatch(Generic[S]):
    """The longest prefix of a query the cache holds from one chain (invariant 1)."""

    length: int
    tokens: tuple[int, ...]  # the query's first ``length`` tokens
    kv: torch.Tensor | None  # [layers, 2, kv_heads, length, head_dim]; None: none held
    source: S | None  # the chain they come from (None: length 0)
    node: CacheNode[S] | None  # the deepest node of the path: what ``lock`` protects


class RadixCache(Generic[S]):
    """Token sequences, their KV and source chains in a radix trie within a byte budget.

    >>> class Chain(str):
    ...     def cut(self, length: int) -> str:
    ...         return self
    >>> cache: RadixCache[Chain] = RadixCache(budget_bytes=1 << 20)
    >>> _ = cache.insert("ns", (1, 2, 3, 4), None, Chain("a"), tag="a")
    >>> match = cache.match_prefix("ns", (1, 2, 3, 9))
    >>> match.length, match.source
    (3, 'a')
    >>> cache.find("ns", "a").tokens
    (1, 2, 3, 4)
    """

    def __init__(self, *, budget_bytes: int | None) -> None:
        self._ledger: EvictionLedger[CacheNode[S]] = EvictionLedger(
            budget_bytes=budget_bytes, eligible=_is_live_leaf)
        self._roots: dict[Hashable, CacheNode[S]] = {}
        self._tags: dict[tuple[Hashable, Hashable], CacheNode[S]] = {}
        self._clock = 0

    @property
    def budget_bytes(self) -> int | None:
        return self._ledger.budget_bytes

    @property
    def nbytes(self) -> int:
        return self._ledger.total_bytes

    def sizes(self) -> EvictionSizes:
        """Evictable and protected bytes and tokens (invariant 2)."""
        return self._ledger.sizes()

    def __len__(self) -> int:
        """Nodes held, roots excluded."""
        return len(self._ledger)

    def match_prefix(self, namespace: Hashable, tokens: Sequence[int]) -> CacheMatch[S]:
        """The longest prefix of ``tokens`` held from one chain (invariant 1)."""
        root = self._roots.get(namespace)
        if root is None:
            return CacheMatch(0, (), None, None, None)
        path: list[CacheNode[S]] = []
        node, position = root, 0
        while position < len(tokens):
            child = node.children.get(int(tokens[position]))
            if child is None:
                break
            shared = _common(child.tokens, tokens, position)
            path.append(child)
            position += shared
            if shared < len(child.tokens):
                break
            node = child
        return self._matched(path, position)

    def find(self, namespace: Hashable, tag: Hashable) -> CacheMatch[S] | None:
        """The whole chain inserted with ``tag`` (None: never inserted, or evicted)."""
        end = self._tags.get((namespace, tag))
        if end is None:
            return None
        path = _path_to(end)
        return self._matched(path, end.depth)

    def insert(self, namespace: Hashable, tokens: Sequence[int], kv: torch.Tensor | None,
               source: S, tag: Hashable | None = None) -> CacheNode[S] | None:
        """Hold ``tokens`` and their KV (``[layers, 2, kv_heads, len(tokens), head_dim]``, or
        None) as coming from ``source``; ``tag`` names the chain for ``find`` (invariant 4).
        The end node, or None once the budget evicted it."""
        if kv is not None and kv.shape[_TOKEN_AXIS] != len(tokens):
            raise AssertionError(f"KV of {kv.shape[_TOKEN_AXIS]} tokens for {len(tokens)}")
        self._clock += 1
        root = self._roots.get(namespace)
        if root is None:
            root = CacheNode(None, (), None, None, 0)
            self._roots[namespace] = root
        path: list[CacheNode[S]] = []
        agrees = True
        node, position = root, 0
        while position < len(tokens):
            child = node.children.get(int(tokens[position]))
            if child is None:
                break
            shared = _common(child.tokens, tokens, position)
            if shared < len(child.tokens):
                child = self._split(child, shared)
            agrees = agrees and _agree(child, source)
            path.append(child)
            node, position = child, position + shared
        if position < len(tokens):
            edge = None if kv is None else kv[:, :, :, position:, :].contiguous().clone()
            leaf = CacheNode(node, tuple(int(t) for t in tokens[position:]), edge, source,
                             len(tokens))
            node.children[leaf.tokens[0]] = leaf
            self._ledger.add(leaf, leaf.nbytes, len(leaf.tokens))
            path.append(leaf)
        end = path[-1] if path else None
        if end is not None and tag is not None and agrees:
            key = (namespace, tag)
            if key not in self._tags:
                self._tags[key] = end
                end.tags.append(key)
        self._touch(path)
        self._ledger.evict_to_budget(self._remove)
        return end if end is not None and end.alive else None

    def lock(self, node: CacheNode[S]) -> None:
        """Protect ``node`` and its path from eviction until ``unlock(node)`` (invariant 2)."""
        for step in _path_to(node):
            self._ledger.lock(step)

    def unlock(self, node: CacheNode[S]) -> None:
        """Release one ``lock(node)``, then evict down to the budget."""
        for step in _path_to(node):
            self._ledger.unlock(step)
        self._ledger.evict_to_budget(self._remove)

    def evict(self, num_bytes: int) -> int:
        """Evict unreferenced leaves, least recently used first, until ``num_bytes`` are freed
        or none is left: the bytes freed."""
        return self._ledger.evict(num_bytes, self._remove)[1]

    def drop(self, namespace: Hashable, gone: Callable[[S, int], bool]) -> int:
        """Remove every unreferenced node of ``namespace`` for which ``gone(source, depth)``
        holds, with the nodes below it (their chains continue it): the nodes removed."""
        root = self._roots.get(namespace)
        if root is None:
            return 0
        removed = 0
        stack = list(root.children.values())
        while stack:
            node = stack.pop()
            if node.source is not None and gone(node.source, node.depth):
                removed += self._drop_subtree(node)
            else:
                stack.extend(node.children.values())
        return removed

    def _drop_subtree(self, top: CacheNode[S]) -> int:
        order: list[CacheNode[S]] = []
        stack = [top]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        removed = 0
        for node in reversed(order):  # leaves first
            if node.children or self._ledger.refs(node):
                continue  # a locked path stays; its owner is told by the backend's commit
            self._ledger.remove(node)
            self._remove(node)
            removed += 1
        return removed

    def _matched(self, path: list[CacheNode[S]], length: int) -> CacheMatch[S]:
        """``path`` cut to where its sources agree with its deepest one (invariant 1)."""
        while path:
            end = path[-1]
            if end.source is not None and all(_agree(n, end.source, length) for n in path):
                break
            length = end.start
            path = path[:-1]
        if not path:
            return CacheMatch(0, (), None, None, None)
        self._clock += 1
        self._touch(path)
        tokens: list[int] = []
        spans: list[torch.Tensor] = []
        for node in path:
            take = min(len(node.tokens), length - node.start)
            tokens.extend(node.tokens[:take])
            if node.kv is not None:
                spans.append(node.kv[:, :, :, :take, :])
        kv = torch.cat(spans, dim=_TOKEN_AXIS) if len(spans) == len(path) else None
        return CacheMatch(length, tuple(tokens), kv, path[-1].source, path[-1])

    def _split(self, child: CacheNode[S], at: int) -> CacheNode[S]:
        """Put a node holding ``child``'s first ``at`` tokens between it and its parent;
        ``child`` keeps its depth, source and tags."""
        parent = child.parent
        if parent is None or not 0 < at < len(child.tokens):
            raise AssertionError(f"split of a root or outside its edge (at={at})")
        upper_kv = None if child.kv is None else child.kv[:, :, :, :at, :].contiguous().clone()
        upper = CacheNode(parent, child.tokens[:at], upper_kv, child.source, child.start + at,
                          last_access=child.last_access)
        child.tokens = child.tokens[at:]
        child.kv = None if child.kv is None else child.kv[:, :, :, at:, :].contiguous().clone()
        child.parent = upper
        upper.children[child.tokens[0]] = child
        parent.children[upper.tokens[0]] = upper
        self._ledger.resize(child, child.nbytes, len(child.tokens))
        self._ledger.add(upper, upper.nbytes, len(upper.tokens), refs=self._ledger.refs(child))
        self._ledger.rank(upper, float(upper.last_access))
        return upper

    def _touch(self, path: list[CacheNode[S]]) -> None:
        for node in path:
            node.last_access = self._clock
            self._ledger.rank(node, float(self._clock))

    def _remove(self, node: CacheNode[S]) -> None:
        """Take out a leaf the ledger has just let go (invariant 3)."""
        parent = node.parent
        if parent is None or not node.alive or node.children:
            raise AssertionError("eviction reached a node that is not a live leaf")
        del parent.children[node.tokens[0]]
        for key in node.tags:
            del self._tags[key]
        node.tags.clear()
        node.alive, node.kv, node.parent = False, None, None
        if parent.parent is not None and not parent.children:
            self._ledger.rank(parent, float(parent.last_access))


def _is_live_leaf(node: CacheNode[S]) -> bool:
    return node.alive and not node.children


def _agree(node: CacheNode[S], source: S, length: int | None = None) -> bool:
    """Whether ``node``'s tokens and KV are ``source``'s chain's over the node's edge."""
    end = node.depth if length is None else min(node.depth, length)
    return node.source is not None and node.source.cut(end) == source.cut(end)


def _common(edge: tuple[int, ...], tokens: Sequence[int], position: int) -> int:
    shared = 0
    for a, b in zip(edge, tokens[position:position + len(edge)], strict=False):
        if a != int(b):
            break
        shared += 1
    return shared


def _path_to(node: CacheNode[S]) -> list[CacheNode[S]]:
    """Root excluded, ``node`` last."""
    path: list[CacheNode[S]] = []
    current: CacheNode[S] | None = node
    while current is not None and current.parent is not None:
        path.append(current)
        current = current.parent
    path.reverse()
    return path

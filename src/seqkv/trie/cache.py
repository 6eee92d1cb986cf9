"""``RadixCache``: a store worker's in-memory prefix index and hot tier, as a radix trie.

Motivation: a store put, append or get needs the tokens and KV of the longest stored prefix of a
session. Looking that prefix up in the backend's index costs a request, and decoding its chain
costs model forwards; the prefixes a worker decoded or coded are kept here, so the next lookup
finds them in memory, token by token. The shape is SGLang's ``BasePrefixCache``
(``mem_cache/radix_cache.py``): ``match_prefix`` returns a match result, ``insert``, ``evict``,
``lock``/``unlock`` references, evictable and protected sizes; the budget and order are
``seqkv.eviction``'s, and the radix trie itself (walk, split, leaves, locks, eviction) is
``seqkv.trie.core``'s, the same one under ``seqkv.trie.radix.PrefixTrie``.

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
3. Only unreferenced leaves are evicted, never a root (enforced: ``seqkv.trie.core``
   invariant 3), least recently used first. After every ``insert`` the total is within
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

from seqkv.eviction import EvictionSizes
from seqkv.trie.core import TOKEN_AXIS, RadixNode, RadixTree, path_to

_TOKEN_BYTES = 8  # what one token costs in the budget, besides its KV


class ChainSource(Protocol):
    """What a node remembers of the stored chain that gave its tokens and KV."""

    def cut(self, length: int) -> Hashable:
        """The identity of the chain's first ``length`` tokens: equal cuts have equal tokens
        and bit-identical KV over them (assumed: the owner's contract)."""
        ...


S = TypeVar("S", bound=ChainSource)


@dataclass(slots=True, eq=False)
class CacheNode(RadixNode["CacheNode[S]"], Generic[S]):
    """One edge of tokens, its KV (``seqkv.trie.core.RadixNode``) and its source."""

    source: S | None = field(kw_only=True)  # None only for a root
    tags: list[tuple[Hashable, Hashable]] = field(default_factory=list, kw_only=True)

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


class RadixCache(RadixTree[CacheNode[S]]):
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
        super().__init__(budget_bytes=budget_bytes)
        self._tags: dict[tuple[Hashable, Hashable], CacheNode[S]] = {}

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
        path, position = self._walk(root, _as_tuple(tokens), split=False)
        return self._matched(path, position)

    def find(self, namespace: Hashable, tag: Hashable) -> CacheMatch[S] | None:
        """The whole chain inserted with ``tag`` (None: never inserted, or evicted)."""
        end = self._tags.get((namespace, tag))
        if end is None:
            return None
        return self._matched(path_to(end), end.depth)

    def insert(self, namespace: Hashable, tokens: Sequence[int], kv: torch.Tensor | None,
               source: S, tag: Hashable | None = None) -> CacheNode[S] | None:
        """Hold ``tokens`` and their KV (``[layers, 2, kv_heads, len(tokens), head_dim]``, or
        None) as coming from ``source``; ``tag`` names the chain for ``find`` (invariant 4).
        The end node, or None when the path holds another chain's KV (nothing is added) or
        once the budget evicted it."""
        if kv is not None and kv.shape[TOKEN_AXIS] != len(tokens):
            raise AssertionError(f"KV of {kv.shape[TOKEN_AXIS]} tokens for {len(tokens)}")
        query = _as_tuple(tokens)
        self._clock += 1
        root = self._roots.get(namespace)
        if root is None:
            root = CacheNode(None, (), None, 0, source=None)
            self._roots[namespace] = root
        path, position = self._walk(root, query, split=True)
        agrees = all(_agree(node, source) for node in path)
        if not agrees:
            # the path holds another chain's KV: a leaf under it could never be matched
            # (``_matched`` cuts where sources stop agreeing), so nothing is added
            self._touch(path)
            return None
        if position < len(query):
            edge = None if kv is None else self._copy_kv(kv, position, len(query))
            parent = path[-1] if path else root
            path.append(self._attach(CacheNode(parent, query[position:], edge, len(query),
                                               source=source)))
        end = path[-1] if path else None
        if end is not None and tag is not None:
            key = (namespace, tag)
            if key not in self._tags:
                self._tags[key] = end
                end.tags.append(key)
        self._touch(path)
        self._evict_to_budget()
        return end if end is not None and end.alive else None

    def lock(self, node: CacheNode[S]) -> None:
        """Protect ``node`` and its path from eviction until ``unlock(node)`` (invariant 2)."""
        self._lock_path(node)

    def unlock(self, node: CacheNode[S]) -> None:
        """Release one ``lock(node)``, then evict down to the budget."""
        self._unlock_path(node)
        self._evict_to_budget()

    def evict(self, num_bytes: int) -> int:
        """Evict unreferenced leaves, least recently used first, until ``num_bytes`` are freed
        or none is left: the bytes freed."""
        return self._evict(num_bytes)[1]

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
        kv = torch.cat(spans, dim=TOKEN_AXIS) if len(spans) == len(path) else None
        return CacheMatch(length, tuple(tokens), kv, path[-1].source, path[-1])

    def _upper(self, child: CacheNode[S], at: int, kv: torch.Tensor | None,
               query: Sequence[int]) -> CacheNode[S]:
        """``child``'s source covers its first ``at`` tokens too; its tags stay with it."""
        return CacheNode(child.parent, child.tokens[:at], kv, child.start + at,
                         last_access=child.last_access, source=child.source)

    def _nbytes(self, node: CacheNode[S]) -> int:
        return node.nbytes

    def _forget(self, node: CacheNode[S]) -> None:
        for key in node.tags:
            del self._tags[key]
        node.tags.clear()


def _agree(node: CacheNode[S], source: S, length: int | None = None) -> bool:
    """Whether ``node``'s tokens and KV are ``source``'s chain's over the node's edge."""
    end = node.depth if length is None else min(node.depth, length)
    return node.source is not None and node.source.cut(end) == source.cut(end)


def _as_tuple(tokens: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(t) for t in tokens)

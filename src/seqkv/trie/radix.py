"""``PrefixTrie``: a path-compressed radix trie over token ids storing each shared prefix's KV once.

Motivation: serving traffic shares long prefixes (system prompts, few-shot blocks, a document
asked about many times). Stored once, a shared prefix's KV costs its bytes once, however many
sessions use it, and a session only has to be coded from the point where it leaves the trie.
This is layer 1 of arXiv 2604.15356 (a probabilistic language trie: every edge carries the
model's log2-probabilities of its tokens), built the way SGLang's RadixAttention builds its
radix tree: reference counts, access statistics, splitting on a match that ends inside an edge,
eviction of unreferenced leaves, and namespaces so that tenants never share a node. The radix
trie itself (walk, split, leaves, locks, eviction order) is ``seqkv.trie.core``'s, the same one
under the store's hot tier (``seqkv.trie.cache``); this module adds the layer-1 payload (log2-
probabilities, prefix hashes, statistics, sessions) and the policy's order.

What each operation mutates:

- ``insert`` may split one edge where the new session leaves the trie (or ends inside an edge),
  adds at most one leaf, attaches KV to stored spans that had none, updates the access statistics
  of its path, locks the path if ``lock=True``, then evicts down to the budget.
- ``match`` splits the edge its match ends inside (so the matched prefix is a node, with a prefix
  hash and KV of its own), updates the access statistics of its path, and locks it if
  ``lock=True``. It never adds tokens or bytes.
- ``resolve`` updates the access statistics of the resolved path only.
- ``release`` unlocks a session's path, then evicts down to the budget (the trie may have gone
  over it while everything was locked); ``evict`` removes unreferenced leaves.
- ``nearest_sessions``, ``distance``, ``sizes``, ``stats``, ``audit``, ``node_info``,
  ``sessions`` and ``session_sequences`` mutate nothing.

Invariants:
1. Every stored prefix is a path from its namespace's root; the trie stores exactly the union of
   the prefixes of what was inserted and not evicted (checked: the hypothesis state machine
   against a list of sequences, ``tests/test_trie_state_machine.py``).
2. Namespaces never share a node: each has its own root, and prefix hashes include the namespace
   (enforced).
3. ``evictable + protected == total`` in tokens and bytes, kept incrementally by the trie's
   ``seqkv.eviction.EvictionLedger`` and re-derived by ``audit`` from a full traversal
   (checked). A node's references in the ledger are the live sessions whose path runs through it
   (checked by ``audit``); protected nodes are those with references. Roots are not in the
   ledger: they hold no tokens, no bytes and no references.
4. Eviction removes only unreferenced leaves; a node on a live session's path and a namespace
   root are never evicted (enforced: ``seqkv.trie.core`` invariant 3; checked by the state
   machine). A node's rank is the policy's priority of its fields as they are now (enforced:
   ``seqkv.trie.core`` invariant 4, since the fields change only on a lookup, which re-ranks
   its path).
5. Splits and evictions never merge nodes, so a prefix hash returned by ``match`` or ``insert``
   resolves until its node is evicted (enforced).
6. When ``budget_bytes`` is set, every ``insert`` and ``release`` ends at or under the budget
   unless everything over it is protected; ``stats().over_budget_inserts`` counts the inserts that
   could not get under it (enforced).
7. Sequences that share a prefix carry the same log2-probabilities and KV on it (assumed: the
   model is deterministic); the trie keeps the values of the first insert of each span.

Concurrency: one ``threading.RLock`` per trie, held for the whole of every public method. That
is enough because no node object escapes the trie (results are frozen copies, and KV tensors are
never written after creation, invariant 6 of ``seqkv.trie.node``), and every operation starts at a
root and may split or evict anywhere along its path, so finer locks would all contend on the root
anyway. Operations are short (no model runs under the lock); the longest is the ``torch.cat`` that
assembles a matched prefix's KV. The lock is reentrant so that ``insert`` can call ``evict``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from seqkv.errors import EvictionConfigError
from seqkv.eviction import EvictionPolicy, EvictionPolicyName, make_policy
from seqkv.session import Prefix
from seqkv.trie.core import TOKEN_AXIS, RadixTree, path_to
from seqkv.trie.errors import (
    PrefixHashMismatchError,
    PrefixNotFoundError,
    TrieConfigError,
    UnknownSessionError,
)
from seqkv.trie.inputs import KVLayout, as_log2_probs, as_token_array, check_kv
from seqkv.trie.keys import (
    DEFAULT_NAMESPACE,
    Namespace,
    NodeId,
    PrefixHash,
    SessionId,
    check_namespace,
    check_prefix_hash,
    prefix_hash_of_array,
)
from seqkv.trie.metric import (
    LogProbInput,
    Neighbor,
    QueryPoint,
    TokenInput,
    rank_sessions,
)
from seqkv.trie.node import TrieNode
from seqkv.trie.sequence import ScoredSequence


@dataclass(frozen=True, slots=True)
class EvictedNode:
    """A node that eviction removed: the prefix ending at it no longer resolves."""

    namespace: Namespace
    prefix_hash: PrefixHash
    start: int  # depth at which its edge started: the prefix up to here is still stored
    end: int  # depth of the removed node
    nbytes: int


@dataclass(frozen=True, slots=True)
class EvictionResult:
    requested_bytes: int
    freed_bytes: int
    evicted: tuple[EvictedNode, ...]

    @property
    def satisfied(self) -> bool:
        return self.freed_bytes >= self.requested_bytes


@dataclass(frozen=True)
class MatchResult:
    """The longest stored prefix of a query."""

    namespace: Namespace
    length: int  # tokens matched
    prefix_hash: PrefixHash  # of the matched prefix: a node boundary after the match
    surprisal_bits: float  # -log2 P_M(matched prefix)
    kv: torch.Tensor | None  # [layers, 2, kv_heads, length, head_dim]; None if empty or not held
    session: SessionId | None  # set when the match locked its path
    node_id: NodeId  # -1 when the namespace holds nothing (a match there creates no root)


@dataclass(frozen=True)
class InsertResult:
    namespace: Namespace
    length: int  # tokens of the session
    hit_tokens: int  # of them, already stored before this insert
    prefix_hash: PrefixHash  # of the whole session
    session: SessionId | None  # set when the insert locked its path
    node_id: NodeId
    evicted: tuple[EvictedNode, ...]  # what the budget made this insert evict

    @property
    def new_tokens(self) -> int:
        return self.length - self.hit_tokens


@dataclass(frozen=True, eq=False)
class ResolvedPrefix(Prefix):
    """Exactly the prefix a hash names: a ``seqkv.session.Prefix`` (tokens, KV over the path,
    the hash), with its namespace and the log2-probabilities along it."""

    namespace: Namespace = DEFAULT_NAMESPACE
    log2_probs: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node's bookkeeping, copied out."""

    node_id: NodeId
    namespace: Namespace
    prefix_hash: PrefixHash
    start: int
    depth: int
    children: int
    ref_count: int
    hit_count: int
    last_access: int
    nbytes: int
    has_kv: bool
    surprisal_bits: float


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session: SessionId
    namespace: Namespace
    length: int
    prefix_hash: PrefixHash


@dataclass(frozen=True, slots=True)
class TrieSizes:
    """The incrementally kept counters (invariant 3)."""

    nodes: int  # namespace roots included
    sessions: int
    evictable_tokens: int
    protected_tokens: int
    evictable_bytes: int
    protected_bytes: int

    @property
    def total_tokens(self) -> int:
        return self.evictable_tokens + self.protected_tokens

    @property
    def total_bytes(self) -> int:
        return self.evictable_bytes + self.protected_bytes


@dataclass(frozen=True, slots=True)
class TrieAudit:
    """The same figures re-derived from a full traversal (``PrefixTrie.audit``)."""

    nodes: int
    total_tokens: int
    total_bytes: int
    evictable_tokens: int
    evictable_bytes: int
    protected_tokens: int
    protected_bytes: int
    evictable_leaves: int


@dataclass(frozen=True, slots=True)
class TrieStats:
    """Cumulative lookup and eviction figures since the trie was created."""

    match_queries: int
    match_tokens: int
    match_hit_tokens: int
    insert_sessions: int
    insert_tokens: int
    insert_hit_tokens: int
    bytes_saved: int  # bytes that inserts found already stored instead of storing them again
    evicted_nodes: int
    evicted_tokens: int
    evicted_bytes: int
    over_budget_inserts: int

    @property
    def hit_rate(self) -> float:
        """Tokens found stored over tokens looked up, matches and inserts together."""
        looked_up = self.match_tokens + self.insert_tokens
        return (self.match_hit_tokens + self.insert_hit_tokens) / looked_up if looked_up else 0.0

    @property
    def match_hit_rate(self) -> float:
        return self.match_hit_tokens / self.match_tokens if self.match_tokens else 0.0

    @property
    def insert_hit_rate(self) -> float:
        return self.insert_hit_tokens / self.insert_tokens if self.insert_tokens else 0.0


class PrefixTrie(RadixTree[TrieNode]):
    """A radix trie of token sequences, their log2-probabilities and their KV.

    >>> trie = PrefixTrie()
    >>> first = trie.insert([1, 2, 3, 4], [-1.0, -2.0, -1.0, -3.0])
    >>> second = trie.insert([1, 2, 9], [-1.0, -2.0, -4.0])
    >>> second.hit_tokens
    2
    >>> trie.match([1, 2, 3, 7]).length  # ends inside the edge 3, 4: splits it
    3
    >>> trie.distance(first.session, second.session)  # -log2 P(1, 2)
    3.0
    >>> released = [trie.release(first.session), trie.release(second.session)]
    >>> trie.evict(10**9).evicted[0].end  # LRU: the leaf 4 goes first
    4
    """

    def __init__(
        self,
        *,
        budget_bytes: int | None = None,
        policy: EvictionPolicy[TrieNode] | EvictionPolicyName = "lru",
        nominal_kv_bytes_per_token: int = 0,
    ) -> None:
        """A trie with an optional KV budget.

        ``nominal_kv_bytes_per_token`` is what a span stored without a KV tensor counts against
        the budget and in the sizes (e.g. 23,040 for SmolLM2-135M's KV at fp16, to simulate a
        cache without holding it); 0 counts such spans as free. Spans with KV count their
        tensors' bytes.
        """
        if budget_bytes is not None and (isinstance(budget_bytes, bool) or budget_bytes < 0):
            raise TrieConfigError(f"budget_bytes must be None or >= 0, got {budget_bytes!r}")
        if nominal_kv_bytes_per_token < 0:
            raise TrieConfigError(
                f"nominal_kv_bytes_per_token must be >= 0, got {nominal_kv_bytes_per_token}"
            )
        try:
            self._policy = make_policy(policy) if isinstance(policy, str) else policy
        except EvictionConfigError as error:
            raise TrieConfigError(str(error)) from error
        super().__init__(budget_bytes=budget_bytes)
        self._lock = threading.RLock()
        self._nominal = nominal_kv_bytes_per_token
        self._geometry: KVLayout | None = None
        self._index: dict[PrefixHash, TrieNode] = {}
        self._sessions: dict[SessionId, TrieNode] = {}
        self._next_node = 0
        self._next_session = 0
        self._match_queries = 0
        self._match_tokens = 0
        self._match_hit_tokens = 0
        self._insert_sessions = 0
        self._insert_tokens = 0
        self._insert_hit_tokens = 0
        self._bytes_saved = 0
        self._evicted_nodes = 0
        self._evicted_tokens = 0
        self._evicted_bytes = 0
        self._over_budget_inserts = 0
        self._evicted_log: list[EvictedNode] = []

    @property
    def policy(self) -> EvictionPolicy[TrieNode]:
        return self._policy

    @property
    def nominal_kv_bytes_per_token(self) -> int:
        return self._nominal

    @property
    def kv_layout(self) -> KVLayout | None:
        """The geometry of the KV tensors held, fixed by the first insert that passes one."""
        with self._lock:
            return self._geometry

    def insert(
        self,
        tokens: TokenInput,
        log2_probs: LogProbInput,
        kv: torch.Tensor | None = None,
        *,
        namespace: Namespace = DEFAULT_NAMESPACE,
        lock: bool = True,
    ) -> InsertResult:
        """Store a session: its tokens, ``log2 P(t_i | t_<i)`` per token, optionally its KV.

        ``kv`` covers the whole session (``[layers, 2, kv_heads, len(tokens), head_dim]``); only
        the spans not yet stored (or stored without KV) are copied from it. With ``lock=True``
        the session's path is protected from eviction until ``release(result.session)``.
        """
        namespace = check_namespace(namespace)
        query = as_token_array(tokens, allow_empty=False)
        probs = as_log2_probs(log2_probs, len(query))
        with self._lock:
            if kv is not None:
                check_kv(kv, len(query), self._geometry)
            self._clock += 1
            root = self._root(namespace)
            key = _as_tuple(query)
            path, hit = self._walk(root, key, split=True)
            saved = 0
            for node in path:
                if node.kv is None and kv is not None:
                    self._attach_kv(node, kv)
                else:
                    saved += node.nbytes
                node.hit_count += 1
            if hit < len(query):
                path.append(self._add_leaf(path[-1] if path else root, query, key, probs, kv))
            end = path[-1]
            self._touch(path)
            session = self._lock_session(end) if lock else None
            self._insert_sessions += 1
            self._insert_tokens += len(query)
            self._insert_hit_tokens += hit
            self._bytes_saved += saved
            evicted, within = self._enforce_budget()
            self._over_budget_inserts += int(not within)
            return InsertResult(
                namespace=namespace, length=len(query), hit_tokens=hit,
                prefix_hash=end.prefix_hash, session=session, node_id=end.node_id,
                evicted=evicted,
            )

    def match(
        self,
        tokens: TokenInput,
        *,
        namespace: Namespace = DEFAULT_NAMESPACE,
        lock: bool = False,
        with_kv: bool = True,
    ) -> MatchResult:
        """The longest stored prefix of ``tokens`` and its KV; splits the edge it ends inside."""
        namespace = check_namespace(namespace)
        query = as_token_array(tokens, allow_empty=True)
        with self._lock:
            self._clock += 1
            self._match_queries += 1
            self._match_tokens += len(query)
            root = self._roots.get(namespace)
            if root is None:
                if lock:
                    root = self._root(namespace)
                else:
                    return MatchResult(
                        namespace=namespace, length=0,
                        prefix_hash=prefix_hash_of_array(namespace, query[:0]),
                        surprisal_bits=0.0, kv=None, session=None, node_id=NodeId(-1),
                    )
            path, _ = self._walk(root, _as_tuple(query), split=True)
            for node in path:
                node.hit_count += 1
            self._touch(path)
            end = path[-1] if path else root
            self._match_hit_tokens += end.depth
            return MatchResult(
                namespace=namespace, length=end.depth, prefix_hash=end.prefix_hash,
                surprisal_bits=end.surprisal_bits,
                kv=self._path_kv(path) if with_kv else None,
                session=self._lock_session(end) if lock else None, node_id=end.node_id,
            )

    def resolve(self, prefix_hash: PrefixHash, *, with_kv: bool = True) -> ResolvedPrefix:
        """Tokens, log2-probabilities and KV of exactly the prefix ``prefix_hash`` names.

        Raises ``PrefixNotFoundError`` when no node ends at that prefix (never stored here, or
        evicted), and ``PrefixHashMismatchError`` when the stored tokens do not hash to it.
        """
        wanted = check_prefix_hash(prefix_hash)
        with self._lock:
            node = self._index.get(wanted)
            if node is None:
                raise PrefixNotFoundError(
                    f"no stored prefix has hash {wanted}: it was never inserted into this trie "
                    "or it has been evicted; insert the prefix again before decoding a session "
                    "that references it"
                )
            path = path_to(node)
            tokens = _concat_tokens(path)
            if prefix_hash_of_array(node.namespace, tokens) != wanted:
                raise PrefixHashMismatchError(
                    f"the trie holds tokens for prefix {wanted} that hash to something else: "
                    "its memory is damaged"
                )
            self._clock += 1
            for step in path:
                step.hit_count += 1
            self._touch(path)
            log2_probs = np.concatenate([n.log2_probs for n in path]) if path else np.zeros(0)
            return ResolvedPrefix(
                tokens=tuple(int(t) for t in tokens),
                kv=self._path_kv(path) if with_kv else None,
                prefix_hash=wanted,
                namespace=node.namespace,
                log2_probs=tuple(float(p) for p in log2_probs),
            )

    def release(self, session: SessionId) -> tuple[EvictedNode, ...]:
        """Unlock a session's path; its nodes become evictable once no other session holds them.

        Returns what the budget then made it evict (nothing without a budget).
        """
        with self._lock:
            end = self._sessions.pop(session, None)
            if end is None:
                raise UnknownSessionError(
                    f"session {session!r} is not held by this trie: it was never issued here or "
                    "it has already been released"
                )
            self._unlock_path(end)
            return self._enforce_budget()[0]

    def evict(self, num_bytes: int) -> EvictionResult:
        """Evict unreferenced leaves, in the policy's order, until ``num_bytes`` are freed.

        Stops early when nothing evictable is left; ``result.satisfied`` says whether it freed
        enough.
        """
        if isinstance(num_bytes, bool) or num_bytes < 0:
            raise TrieConfigError(f"num_bytes must be >= 0, got {num_bytes!r}")
        with self._lock:
            evicted, freed = self._evict_bytes(num_bytes)
            return EvictionResult(requested_bytes=num_bytes, freed_bytes=freed, evicted=evicted)

    def nearest_sessions(
        self,
        tokens: TokenInput,
        k: int | None = None,
        *,
        namespace: Namespace = DEFAULT_NAMESPACE,
    ) -> tuple[Neighbor, ...]:
        """Live sessions of ``namespace``, nearest first: the largest ``d_T`` to ``tokens``.

        See ``seqkv.trie.metric`` for why nearest is the largest d_T. Mutates nothing.
        """
        namespace = check_namespace(namespace)
        if k is not None and k < 0:
            raise TrieConfigError(f"k must be None or >= 0, got {k}")
        query = as_token_array(tokens, allow_empty=True)
        with self._lock:
            return rank_sessions(self._query_point(namespace, query), self._sessions, k)

    def distance(self, a: SessionId, b: SessionId) -> float:
        """``d_T`` between two live sessions, from the stored log2-probabilities (bits).

        Sessions of different namespaces share no node: their distance is 0.
        """
        with self._lock:
            ends = [self._session_end(s) for s in (a, b)]
            ancestors = set(path_to(ends[0]))
            node: TrieNode | None = ends[1]
            while node is not None and node not in ancestors:
                node = node.parent
            return 0.0 if node is None else node.surprisal_bits

    def sizes(self) -> TrieSizes:
        with self._lock:
            kept = self._ledger.sizes()
            return TrieSizes(
                nodes=len(self._index), sessions=len(self._sessions),
                evictable_tokens=kept.evictable_tokens, protected_tokens=kept.protected_tokens,
                evictable_bytes=kept.evictable_bytes, protected_bytes=kept.protected_bytes,
            )

    def stats(self) -> TrieStats:
        with self._lock:
            return TrieStats(
                match_queries=self._match_queries, match_tokens=self._match_tokens,
                match_hit_tokens=self._match_hit_tokens, insert_sessions=self._insert_sessions,
                insert_tokens=self._insert_tokens, insert_hit_tokens=self._insert_hit_tokens,
                bytes_saved=self._bytes_saved, evicted_nodes=self._evicted_nodes,
                evicted_tokens=self._evicted_tokens, evicted_bytes=self._evicted_bytes,
                over_budget_inserts=self._over_budget_inserts,
            )

    def namespaces(self) -> tuple[Namespace, ...]:
        with self._lock:
            return tuple(root.namespace for root in self._roots.values())

    def node_info(self, prefix_hash: PrefixHash) -> NodeInfo:
        """The bookkeeping of the node ending at ``prefix_hash``; mutates nothing."""
        wanted = check_prefix_hash(prefix_hash)
        with self._lock:
            node = self._index.get(wanted)
            if node is None:
                raise PrefixNotFoundError(f"no stored prefix has hash {wanted}")
            return self._info(node)

    def nodes(self) -> tuple[NodeInfo, ...]:
        """Every node, namespace by namespace, in pre-order; mutates nothing."""
        with self._lock:
            return tuple(self._info(node) for node in self._preorder())

    def sessions(self) -> tuple[SessionInfo, ...]:
        with self._lock:
            return tuple(
                SessionInfo(session=s, namespace=e.namespace, length=e.depth,
                            prefix_hash=e.prefix_hash)
                for s, e in self._sessions.items()
            )

    def session_sequences(
        self, namespace: Namespace = DEFAULT_NAMESPACE
    ) -> tuple[ScoredSequence, ...]:
        """Tokens and log2-probabilities of the live sessions of ``namespace``; mutates nothing."""
        with self._lock:
            out: list[ScoredSequence] = []
            for end in self._sessions.values():
                if end.namespace == namespace:
                    path = path_to(end)
                    out.append(ScoredSequence(
                        tokens=_concat_tokens(path),
                        log2_probs=np.concatenate([n.log2_probs for n in path]),
                    ))
            return tuple(out)

    def audit(self) -> TrieAudit:
        """Re-derive every counter from a traversal and check the structural invariants.

        Raises ``AssertionError`` naming the first violated invariant (a bug in the trie, not a
        caller error).
        """
        with self._lock:
            figures = dict.fromkeys(
                ("nodes", "tokens", "bytes", "e_tokens", "e_bytes", "p_tokens", "p_bytes",
                 "leaves"), 0,
            )
            refs: dict[TrieNode, int] = {}
            for end in self._sessions.values():
                for node in path_to(end):
                    refs[node] = refs.get(node, 0) + 1
            for node in self._preorder():
                held = self._refs(node)
                _check_node(node, held, refs.get(node, 0), self._index, self._nominal)
                figures["nodes"] += 1
                size, nbytes = len(node.tokens), node.nbytes
                figures["tokens"] += size
                figures["bytes"] += nbytes
                kind = "p" if held > 0 else "e"
                figures[f"{kind}_tokens"] += size
                figures[f"{kind}_bytes"] += nbytes
                figures["leaves"] += int(self._evictable(node))
            if figures["nodes"] != len(self._index):
                raise AssertionError("the hash index holds nodes that are not in the trie")
            if len(self._ledger) != figures["nodes"] - len(self._roots):
                raise AssertionError("the eviction ledger holds nodes that are not in the trie")
            audit = TrieAudit(
                nodes=figures["nodes"], total_tokens=figures["tokens"],
                total_bytes=figures["bytes"], evictable_tokens=figures["e_tokens"],
                evictable_bytes=figures["e_bytes"], protected_tokens=figures["p_tokens"],
                protected_bytes=figures["p_bytes"], evictable_leaves=figures["leaves"],
            )
            sizes = self._ledger.sizes()
            kept = (sizes.evictable_tokens, sizes.evictable_bytes, sizes.protected_tokens,
                    sizes.protected_bytes)
            derived = (audit.evictable_tokens, audit.evictable_bytes, audit.protected_tokens,
                       audit.protected_bytes)
            if kept != derived:
                raise AssertionError(f"size counters {kept} differ from the traversal {derived}")
            return audit

    def _root(self, namespace: Namespace) -> TrieNode:
        root = self._roots.get(namespace)
        if root is None:
            empty = np.zeros(0, dtype=np.int64)
            root = TrieNode(
                None, (), None, 0, node_id=self._node_id(), namespace=namespace,
                log2_probs=np.zeros(0, dtype=np.float64), path_log2_prob=0.0,
                prefix_hash=prefix_hash_of_array(namespace, empty), nbytes=0,
                created=self._clock,
            )
            self._roots[namespace] = root
            self._index[root.prefix_hash] = root
        return root

    def _node_id(self) -> NodeId:
        self._next_node += 1
        return NodeId(self._next_node)

    def _span_bytes(self, kv: torch.Tensor | None, count: int) -> int:
        return count * self._nominal if kv is None else kv.numel() * kv.element_size()

    def _add_leaf(
        self,
        parent: TrieNode,
        query: npt.NDArray[np.int64],
        key: tuple[int, ...],
        probs: npt.NDArray[np.float64],
        kv: torch.Tensor | None,
    ) -> TrieNode:
        """A new unreferenced leaf under ``parent`` for the rest of ``query`` (``key`` is the
        same tokens as the core's tuple)."""
        start = parent.depth
        span = None if kv is None else self._copy_kv(kv, start, len(query))
        if span is not None and self._geometry is None:
            self._geometry = KVLayout.of(span)
        log2_probs = probs[start:].copy()
        node = TrieNode(
            parent, key[start:], span, len(query), last_access=self._clock,
            node_id=self._node_id(), namespace=parent.namespace, log2_probs=log2_probs,
            path_log2_prob=parent.path_log2_prob + float(np.sum(log2_probs)),
            prefix_hash=prefix_hash_of_array(parent.namespace, query),
            nbytes=self._span_bytes(span, len(query) - start), created=self._clock,
        )
        self._index[node.prefix_hash] = node
        return self._attach(node)

    def _attach_kv(self, node: TrieNode, kv: torch.Tensor) -> None:
        span = self._copy_kv(kv, node.start, node.depth)
        if self._geometry is None:
            self._geometry = KVLayout.of(span)
        node.kv, node.nbytes = span, self._span_bytes(span, len(node.tokens))
        self._resize(node)

    def _upper(self, child: TrieNode, at: int, kv: torch.Tensor | None,
               query: Sequence[int]) -> TrieNode:
        """The upper half of a split: a new node with its own id and prefix hash, ``child``'s
        reference count (given by the core) and statistics; ``child`` keeps its identity, depth
        and prefix hash, so sessions ending at it stay valid and sizes are unchanged."""
        parent = child.parent
        if parent is None:
            raise AssertionError("split of a root")
        depth = child.start + at
        upper = TrieNode(
            parent, child.tokens[:at], kv, depth, last_access=child.last_access,
            node_id=self._node_id(), namespace=child.namespace,
            log2_probs=child.log2_probs[:at].copy(),
            path_log2_prob=parent.path_log2_prob + float(np.sum(child.log2_probs[:at])),
            prefix_hash=prefix_hash_of_array(child.namespace,
                                             np.asarray(query[:depth], dtype=np.int64)),
            nbytes=self._span_bytes(kv, at), hit_count=child.hit_count, created=child.created,
        )
        child.log2_probs = child.log2_probs[at:].copy()
        child.nbytes -= upper.nbytes
        self._index[upper.prefix_hash] = upper
        return upper

    def _nbytes(self, node: TrieNode) -> int:
        return node.nbytes

    def _priority(self, node: TrieNode) -> float:
        return self._policy.priority(node)

    def _copy_kv(self, kv: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """An owned, contiguous host copy of ``kv[:, :, :, start:stop, :]``."""
        span = kv.detach()[:, :, :, start:stop, :]  # [L, 2, H, stop - start, D]
        return span.to(device="cpu", memory_format=torch.contiguous_format, copy=True)

    def _forget(self, node: TrieNode) -> None:
        del self._index[node.prefix_hash]
        self._evicted_nodes += 1
        self._evicted_tokens += len(node.tokens)
        self._evicted_bytes += node.nbytes
        self._evicted_log.append(EvictedNode(
            namespace=node.namespace, prefix_hash=node.prefix_hash, start=node.start,
            end=node.depth, nbytes=node.nbytes))

    def _lock_session(self, end: TrieNode) -> SessionId:
        self._lock_path(end)
        self._next_session += 1
        session = SessionId(self._next_session)
        self._sessions[session] = end
        return session

    def _enforce_budget(self) -> tuple[tuple[EvictedNode, ...], bool]:
        """Evict down to the budget: what went, and whether the budget now holds."""
        self._evicted_log.clear()
        _, within = self._evict_to_budget()
        return tuple(self._evicted_log), within

    def _evict_bytes(self, num_bytes: int) -> tuple[tuple[EvictedNode, ...], int]:
        self._evicted_log.clear()
        _, freed = self._evict(num_bytes)
        return tuple(self._evicted_log), freed

    def _evictable(self, node: TrieNode) -> bool:
        """An unreferenced, live, non-root leaf: the only kind of node eviction removes."""
        return node.alive and node.parent is not None and node.is_leaf and self._refs(node) == 0

    def _info(self, node: TrieNode) -> NodeInfo:
        return NodeInfo(
            node_id=node.node_id, namespace=node.namespace, prefix_hash=node.prefix_hash,
            start=node.start, depth=node.depth, children=len(node.children),
            ref_count=self._refs(node), hit_count=node.hit_count, last_access=node.last_access,
            nbytes=node.nbytes, has_kv=node.kv is not None, surprisal_bits=node.surprisal_bits,
        )

    def _path_kv(self, path: list[TrieNode]) -> torch.Tensor | None:
        spans = [node.kv for node in path]
        if not spans or any(span is None for span in spans):
            return None
        return torch.cat([span for span in spans if span is not None], dim=TOKEN_AXIS)

    def _session_end(self, session: SessionId) -> TrieNode:
        end = self._sessions.get(session)
        if end is None:
            raise UnknownSessionError(
                f"session {session!r} is not held by this trie: never issued here, or released"
            )
        return end

    def _query_point(self, namespace: Namespace, query: npt.NDArray[np.int64]) -> QueryPoint:
        root = self._roots.get(namespace)
        if root is None:
            return QueryPoint(namespace=namespace, full=(), partial=None, matched=0,
                              surprisal_bits=0.0)
        path, matched = self._walk(root, _as_tuple(query), split=False)
        if path and matched < path[-1].depth:
            partial = path.pop()
            parent = path[-1] if path else root
            bits = parent.surprisal_bits - float(np.sum(partial.log2_probs[:matched
                                                                           - partial.start]))
            return QueryPoint(namespace=namespace, full=(root, *path), partial=partial,
                              matched=matched, surprisal_bits=bits)
        end = path[-1] if path else root
        return QueryPoint(namespace=namespace, full=(root, *path), partial=None, matched=matched,
                          surprisal_bits=end.surprisal_bits)

    def _preorder(self) -> Iterator[TrieNode]:
        for root in self._roots.values():
            stack = [root]
            while stack:
                node = stack.pop()
                yield node
                stack.extend(sorted(node.children.values(), key=lambda c: -c.tokens[0]))


def _as_tuple(tokens: npt.NDArray[np.int64]) -> tuple[int, ...]:
    """The core's token key: a tuple of Python ints."""
    return tuple(tokens.tolist())


def _concat_tokens(path: Sequence[TrieNode]) -> npt.NDArray[np.int64]:
    """The tokens of a path (root excluded), as the prefix hash reads them."""
    if not path:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.asarray(node.tokens, dtype=np.int64) for node in path])


def _check_node(
    node: TrieNode, refs: int, sessions_through: int, index: dict[PrefixHash, TrieNode],
    nominal: int,
) -> None:
    """Raise ``AssertionError`` if ``node`` breaks an invariant of ``seqkv.trie.node``."""
    problems = []
    if index.get(node.prefix_hash) is not node:
        problems.append("is not filed under its prefix hash")
    if not node.alive:
        problems.append("is reachable but marked evicted")
    parent = node.parent
    if parent is None:
        if len(node.tokens) or refs or node.kv is not None:
            problems.append("is a root with tokens, KV or references")
    else:
        if len(node.tokens) == 0 or parent.children.get(int(node.tokens[0])) is not node:
            problems.append("is empty or not filed under its first token")
        if node.depth != parent.depth + len(node.tokens):
            problems.append("has a depth unlike its parent's plus its edge")
        expected = parent.path_log2_prob + float(np.sum(node.log2_probs))
        if abs(node.path_log2_prob - expected) > 1e-9 * max(1.0, abs(expected)):
            problems.append("has a path log2-probability unlike its parent's plus its edge")
        if refs != sessions_through:
            problems.append(f"counts {refs} references, {sessions_through} sessions")
    if node.kv is not None and node.kv.shape[TOKEN_AXIS] != len(node.tokens):
        problems.append("holds KV of another length than its edge")
    span_bytes = (len(node.tokens) * nominal if node.kv is None
                  else node.kv.numel() * node.kv.element_size())
    if node.nbytes != span_bytes:
        problems.append(f"counts {node.nbytes} bytes for a span of {span_bytes}")
    if problems:
        raise AssertionError(f"node {node.node_id} at depth {node.depth}: " + "; ".join(problems))

"""The prefix trie against a brute-force model: a list of stored sequences per namespace.

After every step: the matched length equals the longest common prefix with the model's
sequences, the trie stores exactly the union of their prefixes, evictable + protected = total
(counters and a full traversal agree), locked sessions and namespace roots survive eviction,
and every stored prefix resolves to its tokens and KV.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from seqkv.trie import (
    EvictedNode,
    EvictionPolicyName,
    Namespace,
    PrefixTrie,
    SessionId,
    prefix_hash,
)

NAMESPACES = (Namespace(""), Namespace("tenant-b"))
KV_BYTES_PER_TOKEN = 1 * 2 * 1 * 2 * 4  # [layers=1, 2, heads=1, T, dim=2] float32

sequences = st.lists(st.integers(0, 3), min_size=1, max_size=8).map(tuple)
namespaces = st.sampled_from(NAMESPACES)


def log2_probs(tokens: tuple[int, ...]) -> list[float]:
    """A function of the prefix only, as a deterministic model's would be."""
    return [-(1 + (7 * (tokens[i - 1] if i else 5) + t) % 4) / 2 for i, t in enumerate(tokens)]


def kv_of(tokens: tuple[int, ...]) -> torch.Tensor:
    """KV whose token i depends on tokens[:i + 1] only: [1, 2, 1, T, 2]."""
    rows = [[float(sum(tokens[: i + 1])), float(i * 10 + tokens[i])] for i in range(len(tokens))]
    one = torch.tensor(rows, dtype=torch.float32).reshape(1, 1, len(tokens), 2)  # [1, H, T, D]
    return torch.stack([one, -one], dim=1)  # [1, 2, 1, T, 2]


def lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class TrieMachine(RuleBasedStateMachine):
    budget: int | None = None
    policy: EvictionPolicyName = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.trie = PrefixTrie(budget_bytes=self.budget, policy=self.policy)
        self.model: dict[Namespace, list[tuple[int, ...]]] = {ns: [] for ns in NAMESPACES}
        self.sessions: dict[SessionId, tuple[Namespace, tuple[int, ...]]] = {}
        self.used: set[Namespace] = set()

    def longest(self, ns: Namespace, seq: tuple[int, ...]) -> int:
        return max((lcp(seq, stored) for stored in self.model[ns]), default=0)

    def apply_evictions(self, evicted: tuple[EvictedNode, ...]) -> None:
        for node in evicted:
            kept = []
            for seq in self.model[node.namespace]:
                if len(seq) == node.end and prefix_hash(node.namespace, seq) == node.prefix_hash:
                    seq = seq[: node.start]
                if seq:
                    kept.append(seq)
            self.model[node.namespace] = kept

    @rule(ns=namespaces, seq=sequences, lock=st.booleans(), with_kv=st.booleans())
    def insert(self, ns: Namespace, seq: tuple[int, ...], lock: bool, with_kv: bool) -> None:
        expected = self.longest(ns, seq)
        result = self.trie.insert(seq, log2_probs(seq), kv_of(seq) if with_kv else None,
                                  namespace=ns, lock=lock)
        assert result.hit_tokens == expected
        assert result.prefix_hash == prefix_hash(ns, seq)
        self.used.add(ns)
        self.model[ns].append(seq)
        if lock:
            assert result.session is not None
            self.sessions[result.session] = (ns, seq)
        self.apply_evictions(result.evicted)

    @rule(ns=namespaces, seq=sequences, lock=st.booleans())
    def match(self, ns: Namespace, seq: tuple[int, ...], lock: bool) -> None:
        before = self.trie.sizes()
        result = self.trie.match(seq, namespace=ns, lock=lock)
        assert result.length == self.longest(ns, seq)
        assert result.prefix_hash == prefix_hash(ns, seq[: result.length])
        after = self.trie.sizes()
        assert (after.total_tokens, after.total_bytes) == (before.total_tokens, before.total_bytes)
        if result.kv is not None:
            assert torch.equal(result.kv, kv_of(seq[: result.length]))
        if lock:
            assert result.session is not None
            self.used.add(ns)
            self.sessions[result.session] = (ns, seq[: result.length])

    @precondition(lambda self: self.sessions)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        session = data.draw(st.sampled_from(sorted(self.sessions)))
        del self.sessions[session]
        self.apply_evictions(self.trie.release(session))

    @rule(num_bytes=st.integers(0, 200))
    def evict(self, num_bytes: int) -> None:
        result = self.trie.evict(num_bytes)
        self.apply_evictions(result.evicted)

    @rule()
    def evict_everything(self) -> None:
        result = self.trie.evict(10**12)
        self.apply_evictions(result.evicted)
        sizes = self.trie.sizes()
        assert sizes.evictable_tokens == 0
        assert sizes.total_tokens == sizes.protected_tokens
        locked = {(ns, seq[:k]) for ns, seq in self.sessions.values()
                  for k in range(1, len(seq) + 1)}
        assert sizes.total_tokens == len(locked)

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def resolve(self, data: st.DataObject) -> None:
        ns = data.draw(st.sampled_from([n for n in NAMESPACES if self.model[n]]))
        seq = data.draw(st.sampled_from(self.model[ns]))
        resolved = self.trie.resolve(prefix_hash(ns, seq))
        assert resolved.tokens == seq
        assert resolved.log2_probs == pytest.approx(log2_probs(seq))
        if resolved.kv is not None:
            assert torch.equal(resolved.kv, kv_of(seq))

    @invariant()
    def stores_exactly_the_model_and_evictable_plus_protected_is_total(self) -> None:
        sizes, audit = self.trie.sizes(), self.trie.audit()
        prefixes = {(ns, seq[:k]) for ns, stored in self.model.items() for seq in stored
                    for k in range(1, len(seq) + 1)}
        assert audit.total_tokens == len(prefixes)
        assert sizes.evictable_tokens + sizes.protected_tokens == audit.total_tokens
        assert sizes.evictable_bytes + sizes.protected_bytes == audit.total_bytes
        assert audit.evictable_tokens == sizes.evictable_tokens
        assert audit.protected_tokens == sizes.protected_tokens

    @invariant()
    def locked_sessions_and_roots_survive(self) -> None:
        for ns, seq in self.sessions.values():
            info = self.trie.node_info(prefix_hash(ns, seq))
            assert info.depth == len(seq)
            assert seq == () or info.ref_count >= 1
            assert self.longest(ns, seq) == len(seq) or seq == ()
        assert self.used <= set(self.trie.namespaces())
        for ns in self.used:
            assert self.trie.node_info(prefix_hash(ns, ())).depth == 0

    @invariant()
    def budget_holds_unless_protected(self) -> None:
        if self.budget is not None:
            sizes = self.trie.sizes()
            assert sizes.total_bytes <= max(self.budget, sizes.protected_bytes)


class BudgetedLRUMachine(TrieMachine):
    budget = 12 * KV_BYTES_PER_TOKEN


class BudgetedProbabilityMachine(TrieMachine):
    budget = 12 * KV_BYTES_PER_TOKEN
    policy: EvictionPolicyName = "probability"


TestTrie = TrieMachine.TestCase
TestBudgetedLRU = BudgetedLRUMachine.TestCase
TestBudgetedProbability = BudgetedProbabilityMachine.TestCase

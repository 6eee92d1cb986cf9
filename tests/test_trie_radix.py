"""PrefixTrie: insert, match (and its split), resolve, namespaces, KV, statistics, preconditions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqkv.errors import (
    EmptyInputError,
    InvalidArgumentTypeError,
    InvalidKVError,
    InvalidTokensError,
)
from seqkv.trie import (
    DEFAULT_NAMESPACE,
    InvalidLogProbsError,
    InvalidPrefixHashError,
    Namespace,
    PrefixHash,
    PrefixHashMismatchError,
    PrefixNotFoundError,
    PrefixTrie,
    SessionId,
    UnknownSessionError,
    prefix_hash,
)
from seqkv.trie.errors import TrieConfigError
from seqkv.trie.node import TrieNode


def probs(n: int, bits: float = 1.0) -> list[float]:
    return [-bits] * n


def kv_for(tokens: list[int], layers: int = 2, heads: int = 3, dim: int = 4) -> torch.Tensor:
    """KV whose token i depends on tokens[:i + 1] only: [layers, 2, heads, T, dim]."""
    prefix_sums = np.cumsum(tokens, dtype=np.float64)
    base = torch.tensor(prefix_sums, dtype=torch.float32)  # [T]
    grid = torch.arange(layers * 2 * heads * dim, dtype=torch.float32).reshape(
        layers, 2, heads, 1, dim)  # [L, 2, H, 1, D]
    return grid + base.reshape(1, 1, 1, -1, 1)  # [L, 2, H, T, D]


def test_first_insert_stores_everything() -> None:
    trie = PrefixTrie()
    result = trie.insert([1, 2, 3], probs(3))
    assert (result.length, result.hit_tokens, result.new_tokens) == (3, 0, 3)
    assert result.prefix_hash == prefix_hash(DEFAULT_NAMESPACE, [1, 2, 3])
    assert trie.sizes().total_tokens == 3


def test_second_insert_reuses_the_shared_prefix_and_splits() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2, 3, 4], probs(4))
    result = trie.insert([1, 2, 9], probs(3))
    assert result.hit_tokens == 2
    assert trie.sizes().total_tokens == 5
    assert trie.sizes().nodes == 4  # root, [1, 2], [3, 4], [9]


def test_insert_of_a_stored_prefix_splits_at_its_end() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2, 3, 4], probs(4))
    result = trie.insert([1, 2], probs(2))
    assert result.hit_tokens == 2
    assert trie.node_info(result.prefix_hash).depth == 2


def test_match_ending_inside_an_edge_splits_it_without_changing_sizes() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2, 3, 4, 5], probs(5))
    before = trie.sizes()
    result = trie.match([1, 2, 3, 7])
    assert result.length == 3
    after = trie.sizes()
    assert after.nodes == before.nodes + 1
    assert (after.total_tokens, after.total_bytes) == (before.total_tokens, before.total_bytes)
    assert trie.node_info(result.prefix_hash).depth == 3
    trie.audit()


def test_match_of_an_unknown_namespace_finds_nothing_and_mutates_nothing() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2], probs(2))
    result = trie.match([1, 2], namespace=Namespace("other"))
    assert result.length == 0 and result.kv is None and result.session is None
    assert trie.namespaces() == (DEFAULT_NAMESPACE,)


def test_match_returns_the_kv_of_exactly_the_matched_prefix() -> None:
    trie = PrefixTrie()
    a, b = [5, 6, 7, 8], [5, 6, 1]
    trie.insert(a, probs(4), kv_for(a))
    trie.insert(b, probs(3), kv_for(b))
    result = trie.match([5, 6, 7, 2])
    assert result.kv is not None
    assert torch.equal(result.kv, kv_for(a)[:, :, :, :3, :])


def test_kv_is_copied_in() -> None:
    trie = PrefixTrie()
    kv = kv_for([1, 2, 3])
    trie.insert([1, 2, 3], probs(3), kv)
    kv.zero_()
    result = trie.match([1, 2, 3])
    assert result.kv is not None and torch.equal(result.kv, kv_for([1, 2, 3]))


def test_kv_is_attached_to_a_span_stored_without_it() -> None:
    trie = PrefixTrie(nominal_kv_bytes_per_token=1)
    trie.insert([1, 2, 3], probs(3))
    assert trie.match([1, 2, 3]).kv is None
    trie.insert([1, 2, 3, 4], probs(4), kv_for([1, 2, 3, 4]))
    result = trie.match([1, 2, 3, 4])
    assert result.kv is not None and torch.equal(result.kv, kv_for([1, 2, 3, 4]))
    per_token = 2 * 2 * 3 * 4 * 4
    assert trie.audit().total_bytes == 4 * per_token


def test_namespaces_never_share_a_node() -> None:
    trie = PrefixTrie()
    a, b = Namespace("tenant-a"), Namespace("tenant-b")
    first = trie.insert([1, 2, 3], probs(3), namespace=a)
    second = trie.insert([1, 2, 3], probs(3), namespace=b)
    assert second.hit_tokens == 0
    assert first.prefix_hash != second.prefix_hash
    assert trie.sizes().total_tokens == 6
    assert trie.match([1, 2, 3], namespace=a).length == 3
    assert trie.match([1, 2, 3]).length == 0
    assert trie.distance(first.session, second.session) == 0.0  # type: ignore[arg-type]


def test_resolve_returns_the_prefix_tokens_probs_and_kv() -> None:
    trie = PrefixTrie()
    tokens = [4, 5, 6, 7]
    trie.insert(tokens, [-1.0, -0.5, -2.0, -0.25], kv_for(tokens))
    trie.insert([4, 5, 9], probs(3), kv_for([4, 5, 9]))
    resolved = trie.resolve(prefix_hash(DEFAULT_NAMESPACE, [4, 5]))
    assert resolved.tokens == (4, 5)
    assert resolved.log2_probs == (-1.0, -0.5)
    assert resolved.kv is not None and torch.equal(resolved.kv, kv_for(tokens)[:, :, :, :2, :])


def test_resolve_after_eviction_raises_prefix_not_found() -> None:
    trie = PrefixTrie()
    result = trie.insert([1, 2, 3], probs(3), lock=False)
    trie.evict(10**9)
    with pytest.raises(PrefixNotFoundError, match="evicted"):
        trie.resolve(result.prefix_hash)


def test_resolve_of_a_prefix_inside_an_edge_raises_prefix_not_found() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2, 3], probs(3))
    with pytest.raises(PrefixNotFoundError):
        trie.resolve(prefix_hash(DEFAULT_NAMESPACE, [1, 2]))


def test_resolve_of_a_malformed_hash() -> None:
    with pytest.raises(InvalidPrefixHashError, match="64 lowercase hexadecimal"):
        PrefixTrie().resolve(PrefixHash("not-a-hash"))


def test_resolve_refuses_tokens_that_do_not_hash_to_the_request() -> None:
    trie = PrefixTrie()
    result = trie.insert([1, 2, 3], probs(3))
    node = trie._index[result.prefix_hash]
    node.tokens = np.array([1, 2, 4], dtype=np.int64)  # damage the trie's memory
    with pytest.raises(PrefixHashMismatchError, match="damaged"):
        trie.resolve(result.prefix_hash)


def test_access_statistics() -> None:
    trie = PrefixTrie()
    first = trie.insert([1, 2, 3], probs(3))
    assert trie.node_info(first.prefix_hash).hit_count == 0
    trie.match([1, 2, 3])
    trie.insert([1, 2, 3, 4], probs(4))
    info = trie.node_info(first.prefix_hash)
    assert info.hit_count == 2
    assert info.last_access == 3


def test_stats_count_hits_and_bytes_saved() -> None:
    trie = PrefixTrie(nominal_kv_bytes_per_token=10)
    trie.insert([1, 2, 3, 4], probs(4))
    trie.insert([1, 2, 3, 5], probs(4))
    trie.match([1, 2, 9, 9])
    stats = trie.stats()
    assert (stats.insert_tokens, stats.insert_hit_tokens, stats.bytes_saved) == (8, 3, 30)
    assert (stats.match_tokens, stats.match_hit_tokens) == (4, 2)
    assert stats.hit_rate == pytest.approx(5 / 12)


def test_locked_sessions_and_release() -> None:
    trie = PrefixTrie()
    result = trie.insert([1, 2, 3], probs(3))
    assert result.session is not None
    assert trie.sizes().protected_tokens == 3
    trie.release(result.session)
    assert trie.sizes().protected_tokens == 0
    assert trie.sizes().evictable_tokens == 3


def test_match_can_lock_its_path() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2, 3], probs(3), lock=False)
    result = trie.match([1, 2, 7], lock=True)
    assert result.session is not None
    trie.evict(10**9)
    assert trie.match([1, 2]).length == 2
    assert trie.match([1, 2, 3]).length == 2


def test_budget_evicts_unlocked_sessions_on_insert() -> None:
    trie = PrefixTrie(budget_bytes=10, nominal_kv_bytes_per_token=1)
    trie.insert(list(range(8)), probs(8), lock=False)
    result = trie.insert(list(range(100, 108)), probs(8), lock=False)
    assert [e.end for e in result.evicted] == [8]
    assert trie.sizes().total_bytes == 8


def test_budget_is_exceeded_only_by_locked_sessions_and_restored_on_release() -> None:
    trie = PrefixTrie(budget_bytes=10, nominal_kv_bytes_per_token=1)
    first = trie.insert(list(range(8)), probs(8))
    second = trie.insert(list(range(100, 108)), probs(8))
    assert trie.stats().over_budget_inserts == 1
    assert trie.sizes().total_bytes == 16
    assert second.session is not None and first.session is not None
    evicted = trie.release(first.session)
    assert [e.end for e in evicted] == [8]
    assert trie.sizes().total_bytes == 8


def test_session_sequences_and_sessions() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2, 3], [-1.0, -2.0, -3.0])
    trie.insert([1, 2, 4], [-1.0, -2.0, -5.0], lock=False)
    sequences = trie.session_sequences()
    assert len(sequences) == 1
    assert sequences[0].tokens.tolist() == [1, 2, 3]
    assert sequences[0].surprisal_bits == 6.0
    assert [s.length for s in trie.sessions()] == [3]


def test_positive_log_probs_within_rounding_are_clamped() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2], [1e-7, -1.0])
    assert trie.resolve(prefix_hash(DEFAULT_NAMESPACE, [1, 2])).log2_probs == (0.0, -1.0)


def test_nodes_have_no_instance_dict() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2], probs(2))
    node = trie._index[prefix_hash(DEFAULT_NAMESPACE, [1, 2])]
    assert isinstance(node, TrieNode)
    assert not hasattr(node, "__dict__")
    with pytest.raises(AttributeError):
        node.unexpected = 1  # type: ignore[attr-defined]


def test_empty_session() -> None:
    with pytest.raises(EmptyInputError, match="empty"):
        PrefixTrie().insert([], [])


def test_negative_token() -> None:
    with pytest.raises(InvalidTokensError, match=">= 0"):
        PrefixTrie().insert([1, -2], probs(2))


def test_float_tokens() -> None:
    with pytest.raises(InvalidTokensError, match="integers"):
        PrefixTrie().insert([1.5, 2.0], probs(2))  # type: ignore[list-item]


def test_two_dimensional_tokens() -> None:
    with pytest.raises(InvalidTokensError, match="1-D"):
        PrefixTrie().insert(np.array([[1, 2]]), probs(2))


def test_log_probs_of_the_wrong_length() -> None:
    with pytest.raises(InvalidLogProbsError, match="one log2-probability per token"):
        PrefixTrie().insert([1, 2, 3], probs(2))


def test_positive_log_probs() -> None:
    with pytest.raises(InvalidLogProbsError, match="surprisals"):
        PrefixTrie().insert([1, 2], [-1.0, 3.0])


def test_nan_log_probs() -> None:
    with pytest.raises(InvalidLogProbsError, match="finite"):
        PrefixTrie().insert([1, 2], [-1.0, float("nan")])


def test_kv_of_the_wrong_rank() -> None:
    with pytest.raises(InvalidKVError, match="layers, 2, kv_heads"):
        PrefixTrie().insert([1, 2], probs(2), torch.zeros(2, 2, 3, 2))


def test_kv_of_the_wrong_length() -> None:
    with pytest.raises(InvalidKVError, match="covers 3 tokens"):
        PrefixTrie().insert([1, 2], probs(2), kv_for([1, 2, 3]))


def test_kv_of_integers() -> None:
    with pytest.raises(InvalidKVError, match="floating-point"):
        PrefixTrie().insert([1, 2], probs(2), torch.zeros(1, 2, 1, 2, 1, dtype=torch.int32))


def test_kv_of_another_geometry() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2], probs(2), kv_for([1, 2]))
    with pytest.raises(InvalidKVError, match="one trie serves one model"):
        trie.insert([3, 4], probs(2), kv_for([3, 4], heads=5))


def test_release_of_an_unknown_session() -> None:
    with pytest.raises(UnknownSessionError, match="never issued"):
        PrefixTrie().release(SessionId(7))


def test_release_twice() -> None:
    trie = PrefixTrie()
    session = trie.insert([1], probs(1)).session
    assert session is not None
    trie.release(session)
    with pytest.raises(UnknownSessionError, match="already been released"):
        trie.release(session)


def test_negative_budget() -> None:
    with pytest.raises(TrieConfigError, match="budget_bytes"):
        PrefixTrie(budget_bytes=-1)


def test_negative_nominal_bytes() -> None:
    with pytest.raises(TrieConfigError, match="nominal_kv_bytes_per_token"):
        PrefixTrie(nominal_kv_bytes_per_token=-1)


def test_negative_eviction() -> None:
    with pytest.raises(TrieConfigError, match="num_bytes"):
        PrefixTrie().evict(-1)


def test_namespace_of_another_type() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="namespace is a str"):
        PrefixTrie().insert([1], probs(1), namespace=3)  # type: ignore[arg-type]

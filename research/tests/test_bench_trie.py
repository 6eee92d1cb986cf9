"""The trie benchmark: its JSON, determinism, and the relations its figures must satisfy."""

from __future__ import annotations

import doctest
import importlib
import json

import pytest

from research.bench.trie import TrieBenchResult, WorkloadSpec, generate_workload, run_trie_bench
from seqkv.trie.errors import TrieConfigError

REQUIRED = {
    "sessions", "tokens", "bytes_naive", "bytes_trie", "bytes_hashed_blocks", "hit_rate",
    "hit_rate_hashed_blocks", "storage_predicted", "storage_measured",
    "insert_tokens_per_second", "match_tokens_per_second",
}
SMALL = WorkloadSpec(sessions=60, documents=6)


@pytest.fixture(scope="module")
def result() -> TrieBenchResult:
    return run_trie_bench(3, SMALL)


def test_json_has_every_required_figure(result: TrieBenchResult) -> None:
    figures = json.loads(json.dumps(result.to_json_dict()))
    assert set(figures) >= REQUIRED
    assert figures["workload"]["sessions"] == 60
    assert "Zipf" in figures["workload"]["distribution"]


def test_figures_are_consistent(result: TrieBenchResult) -> None:
    assert result.tokens == sum(len(s) for s in generate_workload(SMALL, 3))
    assert result.bytes_naive == result.tokens * SMALL.bytes_per_token
    assert result.bytes_trie <= result.bytes_naive
    assert result.storage_measured == result.bytes_trie / result.bytes_naive
    assert result.storage_measured <= result.storage_measured_clusters + 1e-12
    for rate in (result.hit_rate, result.hit_rate_probability_weighted,
                 result.hit_rate_hashed_blocks):
        assert 0.0 <= rate <= 1.0
    assert result.hit_rate <= result.hit_rate_unbounded
    assert result.hit_rate_hashed_blocks <= result.hit_rate_hashed_blocks_unbounded
    assert result.hit_rate_hashed_blocks_unbounded <= result.hit_rate_unbounded
    assert result.insert_tokens_per_second > 0 and result.match_tokens_per_second > 0


def test_blocks_at_the_trie_hit_rate_is_the_smallest_such_budget(result: TrieBenchResult
                                                                 ) -> None:
    from research.bench.hashed_blocks import HashedBlockCache
    from research.bench.trie import _admit_all, _block_admit

    sessions = generate_workload(SMALL, 3)
    block_bytes = SMALL.block_size * SMALL.bytes_per_token
    needed = round(result.hit_rate * result.tokens)

    def hits(budget: int) -> int:
        cache = HashedBlockCache.with_budget(budget, block_size=SMALL.block_size,
                                             bytes_per_token=SMALL.bytes_per_token)
        return _admit_all(sessions, SMALL.concurrent_sessions, _block_admit(cache),
                          cache.release)[0]

    found = result.bytes_hashed_blocks_at_trie_hit_rate
    assert found % block_bytes == 0
    assert hits(found) >= needed
    assert found == block_bytes or hits(found - block_bytes) < needed


def test_same_seed_same_figures(result: TrieBenchResult) -> None:
    again = run_trie_bench(3, SMALL).to_json_dict()
    first = result.to_json_dict()
    timing = {k for k in first if "per_second" in k}
    assert {k: v for k, v in first.items() if k not in timing} == {
        k: v for k, v in again.items() if k not in timing}


def test_shared_prefixes_carry_equal_log_probs() -> None:
    sessions = generate_workload(SMALL, 5)
    by_prefix: dict[tuple[int, ...], tuple[float, ...]] = {}
    for session in sessions:
        key = tuple(session.tokens[:50].tolist())
        probs = tuple(session.log2_probs[:50].tolist())
        assert by_prefix.setdefault(key, probs) == probs


def test_bad_spec() -> None:
    with pytest.raises(TrieConfigError, match="budget_fraction"):
        WorkloadSpec(budget_fraction=0.0)


def test_bad_length_range() -> None:
    with pytest.raises(TrieConfigError, match="length range"):
        WorkloadSpec(tail_tokens=(10, 5))


@pytest.mark.parametrize("name", ["trie", "hashed_blocks"])
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(f"research.bench.{name}"))
    assert result.attempted > 0 and result.failed == 0

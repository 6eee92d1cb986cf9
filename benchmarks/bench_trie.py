"""Admission and lookup speed of the prefix trie against vLLM-style hashed blocks.

Run with ``.venv/bin/python -m pytest benchmarks --benchmark-enable`` (scripts/bench.sh). The
provider axis: the radix trie (``PrefixTrie``) and the hashed-block baseline
(``HashedBlockCache``, block size 16), on the same generated workload
(``research.bench.trie.generate_workload``, default spec, seed 0). Storage and hit-rate figures
come from one ``run_trie_bench`` and go to ``extra_info``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from research.bench.hashed_blocks import HashedBlockCache
from research.bench.trie import WorkloadSpec, generate_workload, run_trie_bench
from seqkv.trie import PrefixTrie, ScoredSequence

_SPEC = WorkloadSpec()
_SEED = 0


@pytest.fixture(scope="module")
def workload() -> tuple[ScoredSequence, ...]:
    return generate_workload(_SPEC, _SEED)


def _admit_trie(sessions: tuple[ScoredSequence, ...]) -> int:
    trie = PrefixTrie(nominal_kv_bytes_per_token=_SPEC.bytes_per_token)
    hits = 0
    for session in sessions:
        result = trie.insert(session.tokens, session.log2_probs, lock=False)
        hits += result.hit_tokens
    return hits


def _admit_blocks(sessions: tuple[ScoredSequence, ...]) -> int:
    cache = HashedBlockCache(block_size=_SPEC.block_size, bytes_per_token=_SPEC.bytes_per_token)
    hits = 0
    for session in sessions:
        allocation = cache.allocate(session.tokens)
        cache.release(allocation.session)
        hits += allocation.hit_tokens
    return hits


_ADMIT: dict[str, Callable[[tuple[ScoredSequence, ...]], int]] = {
    "trie": _admit_trie,
    "hashed_blocks": _admit_blocks,
}


@pytest.mark.parametrize("provider", ["trie", "hashed_blocks"])
def test_admit(benchmark: Any, provider: str, workload: tuple[ScoredSequence, ...]) -> None:
    hits = benchmark.pedantic(_ADMIT[provider], args=(workload,), rounds=3, iterations=1)
    tokens = sum(len(s) for s in workload)
    benchmark.extra_info.update({"provider": provider, "tokens": tokens, "hit_rate": hits / tokens})
    assert 0 < hits < tokens


@pytest.mark.parametrize("provider", ["trie", "hashed_blocks"])
def test_match(benchmark: Any, provider: str, workload: tuple[ScoredSequence, ...]) -> None:
    trie = PrefixTrie()
    cache = HashedBlockCache(block_size=_SPEC.block_size, bytes_per_token=1)
    for session in workload:
        trie.insert(session.tokens, session.log2_probs, lock=False)
        cache.release(cache.allocate(session.tokens).session)

    def lookup() -> int:
        if provider == "trie":
            return sum(trie.match(s.tokens, with_kv=False).length for s in workload)
        return sum(cache.match(s.tokens) for s in workload)

    matched = benchmark.pedantic(lookup, rounds=3, iterations=1)
    benchmark.extra_info.update({"provider": provider, "matched_tokens": matched})
    assert matched > 0


def test_trie_bench_figures(benchmark: Any) -> None:
    result = benchmark.pedantic(run_trie_bench, args=(_SEED, _SPEC), rounds=1, iterations=1)
    benchmark.extra_info.update({
        k: v for k, v in result.to_json_dict().items() if isinstance(v, int | float)
    })
    assert result.bytes_trie <= result.bytes_naive

"""Tests for seqkv.proofs.memory: the 70B, 128K, fp16 KV-cache figure against arithmetic."""

from __future__ import annotations

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import ProofInputError
from seqkv.proofs import (
    LLAMA_70B_GQA,
    PAPER_70B,
    KVGeometry,
    check_paper_memory_claim,
    implied_kv_heads,
    kv_cache_bytes,
    kv_memory_figure,
)
from seqkv.proofs.memory import GIB


def test_paper_geometry_bytes_exact() -> None:
    assert kv_cache_bytes(PAPER_70B, 128_000) == 335_544_320_000
    assert kv_cache_bytes(PAPER_70B, 131_072) == 343_597_383_680 == 320 * GIB
    assert kv_cache_bytes(LLAMA_70B_GQA, 128_000) == 41_943_040_000
    assert kv_cache_bytes(LLAMA_70B_GQA, 131_072) == 40 * GIB


def test_paper_claim_is_inconsistent() -> None:
    check = check_paper_memory_claim()
    assert check.paper_gigabytes == 80
    assert check.paper_heads_decimal.gigabytes == pytest.approx(335.5, abs=0.05)
    assert check.paper_heads_binary.gigabytes == pytest.approx(343.6, abs=0.05)
    assert check.paper_heads_binary.gibibytes == 320
    assert check.gqa_decimal.gigabytes == pytest.approx(41.9, abs=0.05)
    assert check.gqa_binary.gibibytes == 40
    assert not check.consistent_with_paper_heads
    assert not check.consistent_with_gqa
    assert not check.consistent
    assert len(check.figures) == 4


def test_implied_heads() -> None:
    check = check_paper_memory_claim()
    assert check.implied_kv_heads_binary == 16
    assert check.implied_kv_heads_decimal == sympy.Rational(80 * 10**9, 5_242_880_000)


def test_check_can_say_consistent() -> None:
    assert check_paper_memory_claim(paper_gigabytes=335.5).consistent_with_paper_heads
    assert check_paper_memory_claim(paper_gigabytes=40).consistent_with_gqa


@given(
    st.integers(1, 128),
    st.integers(1, 1_000_000),
    st.integers(1, 1_000_000),
    st.sampled_from([1, 2, 4]),
)
def test_bytes_additive_in_context(
    kv_heads: int, t1: int, t2: int, bytes_per_component: int
) -> None:
    geometry = KVGeometry(layers=80, kv_heads=kv_heads, head_dim=128)
    total = kv_cache_bytes(geometry, t1 + t2, bytes_per_component)
    assert total == kv_cache_bytes(geometry, t1, bytes_per_component) + kv_cache_bytes(
        geometry, t2, bytes_per_component
    )


@pytest.mark.parametrize(("kv_heads", "context_tokens"), [(1, 1), (8, 131_072), (64, 128_000)])
def test_implied_heads_inverts_bytes(kv_heads: int, context_tokens: int) -> None:
    geometry = KVGeometry(layers=80, kv_heads=kv_heads, head_dim=128)
    total = kv_cache_bytes(geometry, context_tokens)
    heads = implied_kv_heads(total, layers=80, head_dim=128, context_tokens=context_tokens)
    assert heads == kv_heads


def test_rejects_zero_context() -> None:
    with pytest.raises(ProofInputError, match="context_tokens"):
        kv_cache_bytes(PAPER_70B, 0)


def test_rejects_zero_bytes_per_component() -> None:
    with pytest.raises(ProofInputError, match="bytes_per_component"):
        kv_cache_bytes(PAPER_70B, 128_000, bytes_per_component=0)


def test_rejects_tolerance_out_of_range() -> None:
    with pytest.raises(ProofInputError, match="tolerance"):
        check_paper_memory_claim(tolerance=1.5)


def test_rejects_non_positive_paper_figure() -> None:
    with pytest.raises(ProofInputError, match="paper_gigabytes"):
        check_paper_memory_claim(paper_gigabytes=0)


def test_relative_error_rejects_non_positive_paper_figure() -> None:
    with pytest.raises(ProofInputError, match="paper_gigabytes"):
        kv_memory_figure(PAPER_70B, 128_000).relative_error(0)


def test_figures_are_slotted() -> None:
    check = check_paper_memory_claim()
    assert not hasattr(check, "__dict__")
    assert not hasattr(check.gqa_binary, "__dict__")

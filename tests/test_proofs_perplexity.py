"""Tests for seqkv.proofs.perplexity: log2(perplexity), and cross-entropy against entropy."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import ProofInputError
from seqkv.proofs import (
    bits_per_token,
    bits_per_token_expr,
    bits_per_token_float,
    cross_entropy_bits,
    entropy_bits,
    perplexity_bound,
    perplexity_for_bits,
)
from seqkv.proofs.perplexity import PAPER_BITS_AT_PERPLEXITY, PERPLEXITY


def test_paper_values() -> None:
    assert bits_per_token_float(10) == pytest.approx(3.3219, abs=1e-4)
    assert bits_per_token_float(20) == pytest.approx(4.3219, abs=1e-4)
    for ppl, paper_bits in PAPER_BITS_AT_PERPLEXITY:
        assert perplexity_bound(ppl).rounds_to(paper_bits)


def test_exact_symbolic_value() -> None:
    assert sympy.simplify(bits_per_token(10) - sympy.log(10) / sympy.log(2)) == 0
    assert bits_per_token(1) == 0


@pytest.mark.parametrize("ppl", [1, 2, 10, 20, 47, 8.5])
def test_bits_per_token_agrees_with_expression(ppl: float) -> None:
    instantiated = bits_per_token_expr().xreplace({PERPLEXITY: sympy.Rational(repr(ppl))})
    assert sympy.simplify(bits_per_token(ppl) - instantiated) == 0


def test_paper_4_3_bits_is_perplexity_19_7() -> None:
    assert float(perplexity_for_bits(4.3)) == pytest.approx(19.70, abs=0.01)


def test_flags_say_cross_entropy() -> None:
    bound = perplexity_bound(10)
    assert bound.is_cross_entropy
    assert bound.upper_bounds_source_entropy_rate
    assert not bound.bounds_model_entropy


@given(st.integers(0, 60))
def test_powers_of_two_are_exact(k: int) -> None:
    assert bits_per_token(2**k) == k


@given(st.fractions(min_value=0, max_value=20, max_denominator=50))
def test_perplexity_for_bits_inverts(bits: Fraction) -> None:
    assert bits_per_token_float(float(perplexity_for_bits(bits))) == pytest.approx(
        float(bits), abs=1e-9
    )


def test_model_entropy_can_be_above_cross_entropy() -> None:
    p, q = [1.0, 0.0], [0.6, 0.4]
    assert entropy_bits(q) > cross_entropy_bits(p, q)


def test_model_entropy_can_be_below_cross_entropy() -> None:
    p, q = [0.5, 0.5], [0.9, 0.1]
    assert entropy_bits(q) < cross_entropy_bits(p, q)


def test_cross_entropy_infinite_off_support() -> None:
    assert cross_entropy_bits([0.5, 0.5], [1.0, 0.0]) == math.inf


@st.composite
def weight_pairs(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    size = draw(st.integers(2, 8))
    weights = st.lists(st.integers(1, 100), min_size=size, max_size=size)
    return draw(weights), draw(weights)


@given(weight_pairs())
def test_gibbs_inequality(weights: tuple[list[int], list[int]]) -> None:
    p = np.asarray(weights[0], dtype=np.float64)
    q = np.asarray(weights[1], dtype=np.float64)
    p, q = p / p.sum(), q / q.sum()
    assert cross_entropy_bits(p, q) >= entropy_bits(p) - 1e-12


def test_rejects_perplexity_below_one() -> None:
    with pytest.raises(ProofInputError, match=">= 1"):
        bits_per_token(0.5)


def test_rejects_nan_perplexity() -> None:
    with pytest.raises(ProofInputError, match="finite"):
        bits_per_token(float("nan"))


def test_rejects_negative_bits() -> None:
    with pytest.raises(ProofInputError, match="bits"):
        perplexity_for_bits(-1)


def test_cross_entropy_rejects_shape_mismatch() -> None:
    with pytest.raises(ProofInputError, match="shape"):
        cross_entropy_bits([1.0], [0.5, 0.5])

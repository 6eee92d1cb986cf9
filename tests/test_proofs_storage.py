"""Tests for seqkv.proofs.storage: the prefix layer's storage corollary and its prefix variant."""

from __future__ import annotations

from fractions import Fraction

import pytest
import sympy
from hypothesis import assume, given
from hypothesis import strategies as st

from seqkv.errors import ProofInputError
from seqkv.proofs import (
    derive_relative_storage,
    relative_storage,
    relative_storage_expr,
    relative_storage_float,
    relative_storage_with_prefix,
    relative_storage_with_prefix_expr,
)
from seqkv.proofs.storage import CLUSTERED_FRACTION, CLUSTERS, SEQUENCE_LENGTH, TAIL_LENGTH

fractions01 = st.fractions(min_value=0, max_value=1, max_denominator=100)
lengths = st.integers(1, 100_000)


def test_exact_values() -> None:
    assert relative_storage(0.5, 100, 1000) == sympy.Rational(11, 20)
    assert relative_storage_float(1, 50, 200) == 0.25
    assert relative_storage(Fraction(9, 10), 64, 4096) == 1 - Fraction(9, 10) * Fraction(63, 64)


def test_derivation_matches_paper() -> None:
    derivation = derive_relative_storage()
    assert derivation.matches_paper
    assert sympy.simplify(derivation.relative - relative_storage_expr()) == 0


def test_symbolic_endpoints() -> None:
    expr = relative_storage_expr()
    assert expr.subs(CLUSTERED_FRACTION, 0) == 1
    assert sympy.simplify(expr.subs(CLUSTERED_FRACTION, 1) - TAIL_LENGTH / SEQUENCE_LENGTH) == 0


@given(lengths, st.data())
def test_no_clusters_stores_everything(n: int, data: st.DataObject) -> None:
    tail = data.draw(st.integers(0, n))
    assert relative_storage(0, tail, n) == 1


@given(lengths, st.data())
def test_all_clustered_stores_tails(n: int, data: st.DataObject) -> None:
    tail = data.draw(st.integers(0, n))
    assert relative_storage(1, tail, n) == sympy.Rational(tail, n)


@given(fractions01, lengths, st.data())
def test_storage_between_tail_ratio_and_one(f: Fraction, n: int, data: st.DataObject) -> None:
    tail = data.draw(st.integers(0, n))
    value = relative_storage(f, tail, n)
    assert sympy.Rational(tail, n) <= value <= 1


@given(fractions01, lengths, st.integers(1, 50), st.data())
def test_singleton_clusters_save_nothing(
    f: Fraction, n: int, multiple: int, data: st.DataObject
) -> None:
    sessions = f.denominator * multiple  # so f x sessions is a whole number of sessions
    tail = data.draw(st.integers(0, n))
    value = relative_storage_with_prefix(
        f, tail, n, clusters=int(f * sessions), prefix_length=n - tail, sessions=sessions
    )
    assert value == 1


@given(fractions01, lengths, st.integers(1, 1000), st.data())
def test_prefix_variant_never_below_paper(
    f: Fraction, n: int, sessions: int, data: st.DataObject
) -> None:
    clustered = f * sessions
    assume(clustered >= 1)  # f >= 1/100 and sessions up to 1000: rarely filtered
    tail = data.draw(st.integers(0, n))
    clusters = data.draw(st.integers(1, int(clustered)))
    prefix = data.draw(st.integers(0, n))
    value = relative_storage_with_prefix(
        f, tail, n, clusters=clusters, prefix_length=prefix, sessions=sessions
    )
    extra = sympy.Rational(clusters * prefix, sessions * n)
    assert value == relative_storage(f, tail, n) + extra


def test_prefix_variant_without_clusters_equals_paper() -> None:
    expr = relative_storage_with_prefix_expr().subs(CLUSTERS, 0)
    assert sympy.simplify(expr - relative_storage_expr()) == 0
    assert relative_storage_with_prefix(0, 10, 100, clusters=0, prefix_length=90, sessions=5) == 1


def test_rejects_fraction_above_one() -> None:
    with pytest.raises(ProofInputError, match="clustered_fraction"):
        relative_storage(1.5, 10, 100)


def test_rejects_negative_fraction() -> None:
    with pytest.raises(ProofInputError, match="clustered_fraction"):
        relative_storage(-0.1, 10, 100)


def test_rejects_tail_longer_than_sequence() -> None:
    with pytest.raises(ProofInputError, match="tail_length"):
        relative_storage(0.5, 200, 100)


def test_rejects_zero_sequence_length() -> None:
    with pytest.raises(ProofInputError, match="sequence_length"):
        relative_storage(0.5, 0, 0)


def test_rejects_more_clusters_than_sessions() -> None:
    with pytest.raises(ProofInputError, match="exceeds"):
        relative_storage_with_prefix(0.5, 10, 100, clusters=6, prefix_length=90, sessions=10)


def test_rejects_clustered_sessions_without_clusters() -> None:
    with pytest.raises(ProofInputError, match="clusters >= 1"):
        relative_storage_with_prefix(0.5, 10, 100, clusters=0, prefix_length=90, sessions=10)


def test_rejects_prefix_longer_than_sequence() -> None:
    with pytest.raises(ProofInputError, match="prefix_length"):
        relative_storage_with_prefix(0.5, 10, 100, clusters=1, prefix_length=101, sessions=10)


def test_rejects_zero_sessions() -> None:
    with pytest.raises(ProofInputError, match="sessions"):
        relative_storage_with_prefix(0.5, 10, 100, clusters=1, prefix_length=90, sessions=0)

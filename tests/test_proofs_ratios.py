"""Tests for seqkv.proofs.ratios: exact per-vector bits, the paper's ratios, and identities."""

from __future__ import annotations

from fractions import Fraction

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import (
    InvalidArgumentTypeError,
    InvalidKVError,
    ProofInputError,
    ProofInputTypeError,
)
from seqkv.proofs import (
    LLAMA_70B_GQA,
    PAPER_70B,
    SMOLLM2_135M,
    KVGeometry,
    components_per_token,
    fp16_bits_per_token,
    gqa_70b_ratio,
    paper_ratio,
    per_vector_bits_per_token,
    per_vector_over_sequential,
    ratio,
    ratio_decreases_in_h,
    ratio_expr,
    sequential_bits_per_component,
)
from seqkv.proofs.ratios import (
    BITS_PER_COMPONENT,
    PAPER_OVERHEAD,
    PAPER_SEQUENTIAL_BITS,
    SEQUENTIAL_BITS,
)

geometries = st.builds(
    KVGeometry,
    layers=st.integers(1, 200),
    kv_heads=st.integers(1, 128),
    head_dim=st.integers(1, 512),
)
positive_fractions = st.fractions(min_value=Fraction(1, 16), max_value=64, max_denominator=64)


def test_paper_per_vector_bits_exact() -> None:
    assert per_vector_bits_per_token(PAPER_70B, 3) == 3_932_160
    assert isinstance(per_vector_bits_per_token(PAPER_70B, 3), sympy.Integer)


def test_paper_ratio_exact_and_rounded() -> None:
    result = paper_ratio()
    assert result.ratio == sympy.Rational(39_321_600, 43)
    assert result.ratio_float == pytest.approx(914_455.8, abs=0.1)
    assert result.sequential_bits == sympy.Rational(43, 10)
    assert result.geometry == PAPER_70B


def test_paper_ratio_with_overhead() -> None:
    result = paper_ratio(PAPER_OVERHEAD)
    assert result.ratio == sympy.Rational(39_321_600, 43 * 1000)
    assert result.ratio_float == pytest.approx(914.456, abs=1e-3)


def test_gqa_ratio_is_eight_times_smaller() -> None:
    gqa = gqa_70b_ratio()
    assert gqa.per_vector_bits == 491_520
    assert gqa.ratio_float == pytest.approx(114_306.98, abs=0.01)
    assert paper_ratio().ratio / gqa.ratio == 8
    assert gqa_70b_ratio(PAPER_OVERHEAD).ratio_float == pytest.approx(114.307, abs=1e-3)
    assert LLAMA_70B_GQA.kv_heads == 8


def test_smollm2_bits_per_token() -> None:
    assert components_per_token(SMOLLM2_135M) == 11_520
    assert fp16_bits_per_token(SMOLLM2_135M) == 184_320
    assert per_vector_bits_per_token(SMOLLM2_135M, 3) == 34_560
    assert per_vector_over_sequential(SMOLLM2_135M, 3, 3.0).ratio == 11_520


def test_float_input_is_decimal_exact() -> None:
    assert ratio(3_932_160, 4.3) == ratio(3_932_160, Fraction(43, 10))
    assert Fraction(43, 10) == PAPER_SEQUENTIAL_BITS


def test_sequential_bits_per_component() -> None:
    assert sequential_bits_per_component(PAPER_70B, 4.3) == sympy.Rational(43, 13_107_200)


def test_ratio_expr_symbols() -> None:
    assert sympy.diff(ratio_expr(), BITS_PER_COMPONENT, 2) == 0
    assert ratio_decreases_in_h()
    assert sympy.diff(ratio_expr(), SEQUENTIAL_BITS).is_negative


@given(geometries, positive_fractions, positive_fractions)
def test_per_vector_bits_linear_in_bits(geometry: KVGeometry, b1: Fraction, b2: Fraction) -> None:
    bits1 = per_vector_bits_per_token(geometry, b1)
    bits2 = per_vector_bits_per_token(geometry, b2)
    assert per_vector_bits_per_token(geometry, b1 + b2) == bits1 + bits2
    assert per_vector_bits_per_token(geometry, 2 * b1) == 2 * bits1


@given(geometries, positive_fractions, positive_fractions, positive_fractions)
def test_ratio_linear_in_bits_per_component(
    geometry: KVGeometry, b1: Fraction, b2: Fraction, h: Fraction
) -> None:
    r1 = per_vector_over_sequential(geometry, b1, h).ratio
    r2 = per_vector_over_sequential(geometry, b2, h).ratio
    assert per_vector_over_sequential(geometry, b1 + b2, h).ratio == r1 + r2


@given(geometries)
def test_fp16_is_16_bits_per_component(geometry: KVGeometry) -> None:
    expected = 2 * geometry.layers * geometry.kv_heads * geometry.head_dim * 16
    assert fp16_bits_per_token(geometry) == expected
    assert fp16_bits_per_token(geometry) == 16 * components_per_token(geometry)


@pytest.mark.parametrize("field", ["layers", "kv_heads", "head_dim"])
def test_geometry_rejects_non_positive(field: str) -> None:
    values = {"layers": 1, "kv_heads": 1, "head_dim": 1, field: 0}
    with pytest.raises(InvalidKVError, match=field):
        KVGeometry(**values)


def test_geometry_rejects_bool() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="layers"):
        KVGeometry(layers=True, kv_heads=1, head_dim=1)


def test_geometry_is_frozen_and_slotted() -> None:
    assert not hasattr(PAPER_70B, "__dict__")
    with pytest.raises(AttributeError):
        PAPER_70B.layers = 1  # type: ignore[misc]


def test_ratio_rejects_zero_sequential_bits() -> None:
    with pytest.raises(ProofInputError, match="sequential_bits"):
        ratio(3_932_160, 0)


def test_ratio_rejects_negative_overhead() -> None:
    with pytest.raises(ProofInputError, match="overhead"):
        ratio(3_932_160, 4.3, overhead=-1)


def test_bits_per_component_rejects_nan() -> None:
    with pytest.raises(ProofInputError, match="finite"):
        per_vector_bits_per_token(PAPER_70B, float("nan"))


def test_bits_per_component_rejects_bool() -> None:
    with pytest.raises(ProofInputTypeError, match="bool"):
        per_vector_bits_per_token(PAPER_70B, True)

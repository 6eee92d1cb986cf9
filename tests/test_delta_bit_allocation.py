"""Bit allocation: the paper's surprisal rule, the fixed-budget variant, and their preconditions."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.delta.bit_allocation import (
    WIDTH_FIELD_BITS,
    AllocationMode,
    allocate_bits,
    fixed_budget,
    surprisal_rule,
    width_bits,
)
from seqkv.errors import DeltaConfigError

surprisals = st.lists(st.floats(0.0, 40.0, allow_nan=False), min_size=1, max_size=200).map(
    lambda xs: np.array(xs, dtype=np.float64)
)
budgets = st.integers(1, 8)


@given(surprisals, budgets)
def test_rule_is_the_papers_formula_clipped_to_8(h: np.ndarray, b0: int) -> None:
    widths = surprisal_rule(h, b0)
    mean = h.mean()
    if mean == 0:
        assert (widths == b0).all()
        return
    for w, hi in zip(widths, h, strict=True):
        assert w == min(8, max(1, math.floor(b0 * hi / mean)))


@given(surprisals, budgets)
def test_fixed_budget_spends_exactly_the_budget_within_1_to_8(h: np.ndarray, b0: int) -> None:
    widths = fixed_budget(h, b0)
    assert int(widths.sum()) == round(b0 * h.size)
    assert widths.min() >= 1 and widths.max() <= 8
    assert widths.dtype == np.int64


@given(surprisals, budgets, st.sampled_from([surprisal_rule, fixed_budget]))
def test_surprisal_modes_are_monotone(
    h: np.ndarray, b0: int, allocate: Callable[[np.ndarray, int], np.ndarray]
) -> None:
    widths = allocate(h, b0)
    order = np.argsort(h, kind="stable")
    for a, b in itertools.pairwise(order):
        if h[b] > h[a]:
            assert widths[b] >= widths[a]


@given(surprisals, budgets)
def test_fixed_budget_is_proportional_when_nothing_clips(h: np.ndarray, b0: int) -> None:
    # Within one bit of b0 * h_i / hbar wherever the ideal width stays inside [1, 8].
    mean = h.mean()
    if mean == 0:
        return
    ideal = b0 * h / mean
    if ideal.min() < 1 or ideal.max() > 8:
        return
    assert np.abs(fixed_budget(h, b0) - ideal).max() <= 1.0 + 1e-9


def test_zero_surprisal_falls_back_to_uniform() -> None:
    assert surprisal_rule(np.zeros(4), 3).tolist() == [3, 3, 3, 3]
    assert fixed_budget(np.zeros(4), 3).tolist() == [3, 3, 3, 3]


def test_uniform_mode_and_width_side_information() -> None:
    assert allocate_bits(AllocationMode.UNIFORM, 2, 3).tolist() == [2, 2, 2]
    assert width_bits(10) == 10 * WIDTH_FIELD_BITS == 30


def test_surprisal_modes_need_surprisal() -> None:
    with pytest.raises(DeltaConfigError, match="needs the per-token surprisal"):
        allocate_bits(AllocationMode.SURPRISAL, 3, 4)


def test_surprisal_length_must_match() -> None:
    with pytest.raises(DeltaConfigError, match="3 surprisal values for 4 tokens"):
        allocate_bits(AllocationMode.SURPRISAL_BUDGET, 3, 4, np.ones(3))


def test_budget_must_be_a_codebook_width() -> None:
    with pytest.raises(DeltaConfigError, match=r"1\.\.8"):
        surprisal_rule(np.ones(3), 9)


def test_max_bits_beyond_8_is_refused() -> None:
    with pytest.raises(DeltaConfigError, match="max_bits"):
        fixed_budget(np.ones(3), 3, max_bits=9)


def test_negative_surprisal_is_refused() -> None:
    with pytest.raises(DeltaConfigError, match="finite and >= 0"):
        fixed_budget(np.array([1.0, -0.5]), 3)


def test_nan_surprisal_is_refused() -> None:
    with pytest.raises(DeltaConfigError, match="finite and >= 0"):
        surprisal_rule(np.array([1.0, np.nan]), 3)


def test_empty_surprisal_is_refused() -> None:
    with pytest.raises(DeltaConfigError, match="non-empty"):
        surprisal_rule(np.array([]), 3)


def test_no_tokens_is_refused() -> None:
    with pytest.raises(DeltaConfigError, match="num_tokens"):
        allocate_bits(AllocationMode.UNIFORM, 3, 0)

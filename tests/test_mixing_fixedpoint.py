"""The mixer's exact fixed-point functions: the table is exact, the functions are accurate."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.mixing.fixedpoint import (
    LOG2_SLACK,
    ONE,
    STRETCH_LIMIT,
    TOTAL,
    FixedPoint,
    _exact_growth_entry,
)
from seqkv.mixing.mixer import SHARE_COST


@pytest.fixture(scope="module")
def fixed() -> FixedPoint:
    return FixedPoint.build()


def test_every_table_entry_is_the_exact_ceiling(fixed: FixedPoint) -> None:
    assert len(fixed.growth) == 257
    for f in range(256):
        assert fixed.growth[f] == _exact_growth_entry(f), f
    assert fixed.growth[256] == 1 << 63


def test_the_table_is_the_same_on_every_build(fixed: FixedPoint) -> None:
    assert FixedPoint.build() == fixed


@given(st.integers(1, (1 << 64) - 1))
def test_log2_is_within_the_stated_slack(value: int) -> None:
    fixed = FixedPoint.build()
    assert abs(fixed.log2_fixed(value) - ONE * math.log2(value)) < LOG2_SLACK


def test_log2_of_powers_of_two_is_exact(fixed: FixedPoint) -> None:
    assert [fixed.log2_fixed(1 << k) for k in range(64)] == [k * ONE for k in range(64)]


@given(st.integers(1, TOTAL - 1))
def test_squash_inverts_stretch_to_within_a_thousandth(count: int) -> None:
    fixed = FixedPoint.build()
    back = fixed.squash(fixed.stretch(count))
    # Relative to the smaller of the two tails: the stretch is accurate in both.
    assert abs(back - count) <= max(1, min(count, TOTAL - count) // 1000)


def test_squash_is_monotone_and_stays_inside_the_total(fixed: FixedPoint) -> None:
    values = [fixed.squash(s) for s in range(-STRETCH_LIMIT - 64, STRETCH_LIMIT + 64, 37)]
    assert all(a <= b for a, b in itertools.pairwise(values))
    assert values[0] == 1 and values[-1] == TOTAL - 1
    assert fixed.squash(0) == TOTAL // 2


def test_stretch_is_odd_around_one_half(fixed: FixedPoint) -> None:
    for count in (1, 5, 1 << 20, 123_456_789, TOTAL // 3):
        assert fixed.stretch(count) == -fixed.stretch(TOTAL - count)


@pytest.mark.parametrize("shift", sorted(SHARE_COST))
def test_share_costs_round_the_exact_cost_up(shift: int) -> None:
    exact = -math.log2(1 - 2.0**-shift) * (1 << 24)
    assert exact <= SHARE_COST[shift] < exact + 1

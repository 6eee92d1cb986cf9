"""Each estimator on synthetic sources with a known answer: the interval covers the truth."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from chance import MAX_EXAMPLES, max_successes, min_successes
from seqkv.checker.estimators import (
    Interval,
    dirichlet_entropy,
    mean_interval,
    percentile_interval,
    trend,
)
from seqkv.checker.known_sources import MarkovSource, entropy_bits
from seqkv.checker.sampling import estimate_entropy_rate
from seqkv.errors import InsufficientSamplesError

# NOTE: worst coverage measured per estimator (reports/estimator_coverage.md), rounded down;
# the thresholds below follow from them (tests/chance.py).
DIRICHLET_COVERAGE_AT_99 = 0.95
MEAN_COVERAGE_AT_95 = 0.90
RATE_COVERAGE_AT_99 = 0.95
TREND_FALSE_ALARM_RATE = 0.025


@given(st.integers(2, 12), st.integers(0, 2**31))
@example(k=2, seed=158526403)  # p_min = 2.9e-4: the rare symbol is often unseen
@example(k=2, seed=522)  # p_min = 4.6e-4
@example(k=2, seed=40)  # p = 0.491: near uniform, where the delta method collapsed
def test_dirichlet_interval_covers_known_entropy(k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k))
    truth = entropy_bits(p)
    covered = [
        dirichlet_entropy(rng.choice(k, size=4000, p=p), k, confidence=0.99,
                          seed=seed + i).covers(truth)
        for i in range(20)
    ]
    assert sum(covered) >= min_successes(20, DIRICHLET_COVERAGE_AT_99)


@pytest.mark.parametrize("p", [[3e-4, 1 - 3e-4], [0.5, 0.5], [0.49, 0.51], [1 / 8] * 8,
                               [0.5, 0.3, 0.2, 0, 0, 0, 0, 0], [1.0, 0.0]])
def test_dirichlet_interval_covers_boundary_sources(p: list[float]) -> None:
    """Rare, uniform, near-uniform, unseen and degenerate sources: the regimes of a boundary."""
    rng = np.random.default_rng(7)
    truth = entropy_bits(np.array(p))
    covered = sum(
        dirichlet_entropy(rng.choice(len(p), size=4000, p=p), len(p), confidence=0.99,
                          seed=i).covers(truth)
        for i in range(40)
    )
    assert covered >= min_successes(40, DIRICHLET_COVERAGE_AT_99, examples=1)


def test_dirichlet_interval_of_a_constant_source_starts_at_zero() -> None:
    interval = dirichlet_entropy(np.zeros(500, dtype=np.int64), 8)
    assert interval.low == 0.0 and interval.high > 0.0


def test_dirichlet_estimate_corrects_plug_in_bias_upwards() -> None:
    rng = np.random.default_rng(0)
    p = np.full(64, 1 / 64)
    estimates = [dirichlet_entropy(rng.choice(64, size=300, p=p), 64, seed=i).estimate
                 for i in range(50)]
    plug_in = [entropy_bits(np.bincount(rng.choice(64, size=300, p=p)) / 300)
               for _ in range(50)]
    # the plug-in estimate is ~0.15 bits low here; the posterior mean much closer to 6
    assert abs(6.0 - np.mean(estimates)) < 0.05 < 6.0 - np.mean(plug_in)


@given(st.integers(0, 2**31))
def test_mean_interval_covers_true_cross_entropy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(50))
    truth = entropy_bits(p)  # E[-log2 p(X)] for X ~ p
    covered = 0
    for _ in range(100):
        x = rng.choice(50, size=500, p=p)
        covered += mean_interval(-np.log2(p[x])).covers(truth)
    assert covered >= min_successes(100, MEAN_COVERAGE_AT_95)


@given(st.integers(0, 2**31))
def test_entropy_rate_interval_covers_the_markov_rate(seed: int) -> None:
    rng = np.random.default_rng(seed)
    covered = surprisal_covered = 0
    for _ in range(10):
        source = MarkovSource(int(rng.integers(2**31)))
        estimate = estimate_entropy_rate(source, sequences=40, length=60,
                                         seed=int(rng.integers(2**31)), confidence=0.99)
        truth = source.block_entropy_per_token(60)
        covered += estimate.entropy_rate.covers(truth)
        surprisal_covered += estimate.sampled_surprisal.covers(truth)
    assert covered >= min_successes(10, RATE_COVERAGE_AT_99, examples=2 * MAX_EXAMPLES)
    assert surprisal_covered >= min_successes(10, RATE_COVERAGE_AT_99,
                                              examples=2 * MAX_EXAMPLES)


@given(st.integers(0, 2**31))
def test_trend_detects_a_decreasing_series_and_not_noise(seed: int) -> None:
    rng = np.random.default_rng(seed)
    falling = np.linspace(6, 3, 400) + rng.normal(0, 1, 400)
    assert trend(falling).decreasing()
    false_alarms = sum(trend(rng.normal(4, 1, 400)).decreasing() for _ in range(100))
    assert false_alarms <= max_successes(100, TREND_FALSE_ALARM_RATE, examples=MAX_EXAMPLES)


def test_percentile_interval_brackets_the_median() -> None:
    interval = percentile_interval(np.arange(101, dtype=np.float64), confidence=0.9)
    assert (interval.low, interval.estimate, interval.high) == pytest.approx((5.0, 50.0, 95.0))


def test_interval_rejects_an_estimate_outside_it() -> None:
    with pytest.raises(ValueError, match="excludes"):
        Interval(2.0, 0.0, 1.0, 0.95, "x")


def test_estimators_reject_too_few_samples() -> None:
    with pytest.raises(InsufficientSamplesError, match="at least 2"):
        mean_interval(np.array([1.0]))
    with pytest.raises(InsufficientSamplesError, match="at least 2"):
        dirichlet_entropy(np.array([1]), 4)
    with pytest.raises(InsufficientSamplesError, match="lie in"):
        dirichlet_entropy(np.array([1, 9]), 4)
    with pytest.raises(InsufficientSamplesError, match="at least 4"):
        trend(np.array([1.0, 2.0]))

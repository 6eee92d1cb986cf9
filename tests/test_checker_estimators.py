"""Each estimator on synthetic sources with a known answer: its interval covers the truth as
often as the coverage study measured, and is no wider than a calibrated interval would be.

Coverage alone cannot fail an interval that is too wide (``[0, log2 K]`` always covers), and a
test of i.i.d. samples cannot fail an interval that ignores autocorrelation. So every estimator
is tested on both counts, and the two defects are run as mutants that must fail
(``test_*_mutant_*``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scipy import stats

from chance import MAX_EXAMPLES, max_successes, min_successes
from seqkv.checker.estimators import (
    Interval,
    dirichlet_entropy,
    mean_interval,
    percentile_interval,
    trend,
)
from seqkv.checker.known_sources import MarkovSource, ar1_series, entropy_bits
from seqkv.checker.sampling import estimate_entropy_rate
from seqkv.errors import InsufficientSamplesError
from seqkv.schedule import pinned_threads


def _rate(measured: float, intervals: int) -> float:
    """A measured coverage minus three of its Monte-Carlo standard errors."""
    return measured - 3 * float(np.sqrt(measured * (1 - measured) / intervals))


# NOTE: coverage thresholds from the worst cell of each estimator in the coverage study
# (benchmarks/estimator_coverage.py, reports/estimator_coverage.md), minus three Monte-Carlo
# standard errors; tests/chance.py turns each into a pass count that fails by chance less than
# once in 10,000 runs.
DIRICHLET_COVERAGE_AT_99 = _rate(0.984, 1000)  # K=64, p ~ Dirichlet(1)
MEAN_COVERAGE_AT_95 = _rate(0.943, 1000)  # AR(1) phi = 0.9, 2,000 samples (the tested cells)
RATE_COVERAGE_AT_99 = _rate(0.995, 200)  # the entropy rate, 8-symbol Markov chains
TREND_FALSE_ALARM_RATE = 0.025
# NOTE: width: mean width over 2 z RMSE of the estimate against the truth. The study's widest
# cell is 1.31 (over 1,000 intervals); a test's 20-100 intervals estimate the RMSE with up to
# about 30% error, hence the margin. ``[0, log2 K]`` scores in the tens; a calibrated interval 1.
WIDTH_RATIO_LIMIT = 2.5
# An RMSE of zero (a constant source estimated exactly) leaves any width unexplained: a floor.
WIDTH_FLOOR_BITS = 0.02

Estimator = Callable[[npt.NDArray[np.int64], int, float, int], Interval]
MeanEstimator = Callable[[npt.NDArray[np.float64]], Interval]


@dataclass(frozen=True)
class Calibration:
    """How a batch of intervals fared against their known truths."""

    covered: int
    required: int
    width: float  # mean width
    allowed_width: float  # WIDTH_RATIO_LIMIT * 2 z RMSE + the floor

    @property
    def covers(self) -> bool:
        return self.covered >= self.required

    @property
    def narrow(self) -> bool:
        return self.width <= self.allowed_width


def calibration(intervals: Sequence[Interval], truths: Sequence[float], rate: float,
                examples: int = MAX_EXAMPLES, floor: float = WIDTH_FLOOR_BITS) -> Calibration:
    confidence = intervals[0].confidence
    z = stats.norm.ppf(0.5 + confidence / 2)
    errors = np.array([i.estimate - t for i, t in zip(intervals, truths, strict=True)])
    rmse = float(np.sqrt(np.mean(errors**2)))
    return Calibration(
        covered=sum(i.covers(t) for i, t in zip(intervals, truths, strict=True)),
        required=min_successes(len(intervals), rate, examples=examples),
        width=float(np.mean([i.high - i.low for i in intervals])),
        allowed_width=WIDTH_RATIO_LIMIT * 2 * z * rmse + floor)


def dirichlet_calibration(estimator: Estimator, p: npt.NDArray[np.float64], seed: int,
                          repeats: int = 20, examples: int = MAX_EXAMPLES) -> Calibration:
    rng = np.random.default_rng(seed)
    k = p.size
    truth = entropy_bits(p)
    intervals = [estimator(rng.choice(k, size=4000, p=p), k, 0.99, seed + i)
                 for i in range(repeats)]
    return calibration(intervals, [truth] * repeats, DIRICHLET_COVERAGE_AT_99, examples)


def ar1_calibration(estimator: MeanEstimator, seed: int, phi: float = 0.9, repeats: int = 100,
                    examples: int = MAX_EXAMPLES) -> Calibration:
    rng = np.random.default_rng(seed)
    intervals = [estimator(ar1_series(rng, 2000, phi) + 4.0) for _ in range(repeats)]
    return calibration(intervals, [4.0] * repeats, MEAN_COVERAGE_AT_95, examples, floor=0.0)


def _dirichlet(symbols: npt.NDArray[np.int64], k: int, confidence: float, seed: int) -> Interval:
    return dirichlet_entropy(symbols, k, confidence=confidence, seed=seed)


@given(st.integers(2, 12), st.integers(0, 2**31))
@example(k=2, seed=158526403)  # p_min = 2.9e-4: the rare symbol is often unseen
@example(k=2, seed=522)  # p_min = 4.6e-4
@example(k=2, seed=40)  # p = 0.491: near uniform, where the delta method collapsed
def test_dirichlet_interval_covers_known_entropy_and_is_narrow(k: int, seed: int) -> None:
    p = np.random.default_rng(seed).dirichlet(np.ones(k))
    result = dirichlet_calibration(_dirichlet, p, seed)
    assert result.covers, result
    assert result.narrow, result


@pytest.mark.parametrize("p", [[3e-4, 1 - 3e-4], [0.5, 0.5], [0.49, 0.51], [1 / 8] * 8,
                               [0.5, 0.3, 0.2, 0, 0, 0, 0, 0], [1.0, 0.0]])
def test_dirichlet_interval_covers_boundary_sources(p: list[float]) -> None:
    """Rare, uniform, near-uniform, unseen and degenerate sources: the regimes of a boundary."""
    result = dirichlet_calibration(_dirichlet, np.array(p), 7, repeats=40, examples=1)
    assert result.covers, result
    assert result.narrow, result


def _zero_to_log2_k(symbols: npt.NDArray[np.int64], k: int, confidence: float,
                    seed: int) -> Interval:
    """A mutant: the real estimate inside the trivial interval [0, log2 K]."""
    estimate = dirichlet_entropy(symbols, k, confidence=confidence, seed=seed).estimate
    return Interval(estimate, 0.0, float(np.log2(k)), confidence, "[0, log2 K]")


@pytest.mark.parametrize("k, seed", [(2, 40), (5, 3), (12, 11)])
def test_mutant_zero_to_log2_k_covers_but_fails_the_width_test(k: int, seed: int) -> None:
    p = np.random.default_rng(seed).dirichlet(np.ones(k))
    result = dirichlet_calibration(_zero_to_log2_k, p, seed)
    assert result.covers and not result.narrow, result


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
def test_mean_interval_covers_true_cross_entropy_and_is_narrow(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(50))
    truth = entropy_bits(p)  # E[-log2 p(X)] for X ~ p
    intervals = [mean_interval(-np.log2(p[rng.choice(50, size=500, p=p)])) for _ in range(100)]
    result = calibration(intervals, [truth] * 100, MEAN_COVERAGE_AT_95, floor=0.0)
    assert result.covers, result
    assert result.narrow, result


@given(st.integers(0, 2**31))
def test_mean_interval_covers_the_mean_of_an_autocorrelated_series(seed: int) -> None:
    result = ar1_calibration(mean_interval, seed)
    assert result.covers, result
    assert result.narrow, result


def _iid_interval(samples: npt.NDArray[np.float64]) -> Interval:
    """A mutant: the t-interval of i.i.d. samples, blind to autocorrelation."""
    x = np.asarray(samples, dtype=np.float64)
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return Interval(float(x.mean()), float(x.mean()) - half, float(x.mean()) + half, 0.95,
                    "i.i.d. t-interval")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mutant_iid_interval_fails_on_an_autocorrelated_series(seed: int) -> None:
    result = ar1_calibration(_iid_interval, seed)
    assert not result.covers, result


@given(st.integers(0, 2**31))
def test_entropy_rate_interval_covers_the_markov_rate_and_is_narrow(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rates, surprisals, truths = [], [], []
    for _ in range(10):
        source = MarkovSource(int(rng.integers(2**31)))
        # NOTE: one intra-op thread: torch's float64 ``exp`` runs on MKL's VML, which after any
        # ``torch.set_num_threads`` call (the model tests before this one make them) wakes
        # MKL's thread team even for these 320-value arrays, and on two busy cores each wake
        # waits for a core. Elementwise results do not depend on the thread count.
        with pinned_threads(1):
            estimate = estimate_entropy_rate(source, sequences=40, length=60,
                                             seed=int(rng.integers(2**31)), confidence=0.99)
        rates.append(estimate.entropy_rate)
        surprisals.append(estimate.sampled_surprisal)
        truths.append(source.block_entropy_per_token(60))
    for intervals in (rates, surprisals):
        result = calibration(intervals, truths, RATE_COVERAGE_AT_99, examples=2 * MAX_EXAMPLES)
        assert result.covers, result
        assert result.narrow, result


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

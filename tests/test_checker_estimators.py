"""Each estimator on synthetic sources with a known answer: the interval covers the truth."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv.checker.estimators import (
    Interval,
    mean_interval,
    miller_madow_entropy,
    percentile_interval,
    trend,
)
from seqkv.checker.sampling import estimate_entropy_rate


def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


@given(st.integers(2, 12), st.integers(0, 2**31))
def test_miller_madow_interval_covers_known_entropy(k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k))
    truth = _entropy(p)
    covered = [
        miller_madow_entropy(rng.choice(k, size=4000, p=p), confidence=0.99).covers(truth)
        for _ in range(20)
    ]
    assert sum(covered) >= 17  # 99% intervals: 20 of 20 expected, 17 allows bad luck


def test_miller_madow_corrects_plug_in_bias_downwards() -> None:
    rng = np.random.default_rng(0)
    p = np.full(64, 1 / 64)
    estimates = [miller_madow_entropy(rng.choice(64, size=300, p=p)).estimate for _ in range(200)]
    plug_in_gap = 6.0 - np.mean(estimates)
    assert abs(plug_in_gap) < 0.05  # the plug-in estimate alone is ~0.15 bits low here


def test_mean_interval_covers_true_cross_entropy() -> None:
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(50))
    truth = _entropy(p)  # E[-log2 p(X)] for X ~ p
    covered = 0
    for _ in range(100):
        x = rng.choice(50, size=500, p=p)
        covered += mean_interval(-np.log2(p[x])).covers(truth)
    assert covered >= 88


class MarkovSource:
    """A two-state-per-symbol Markov chain over 8 symbols with a known entropy rate."""

    vocab_size = 8

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.transition = rng.dirichlet(np.ones(8) * 0.5, size=8)  # [from, to]
        eigenvalues, eigenvectors = np.linalg.eig(self.transition.T)
        stationary = np.real(eigenvectors[:, np.argmin(np.abs(eigenvalues - 1))])
        self.stationary = stationary / stationary.sum()
        self.rate = float(sum(self.stationary[i] * _entropy(self.transition[i])
                              for i in range(8)))

    def block_entropy_per_token(self, length: int) -> float:
        """H(t_1..t_L) / L from the stationary start: what the estimator targets."""
        return (_entropy(self.stationary) + (length - 1) * self.rate) / length

    def start(self, batch: int) -> torch.Tensor:
        return torch.log(torch.tensor(self.stationary)).expand(batch, -1).clone()

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.tensor(self.transition))[tokens]


@pytest.mark.parametrize("seed", range(6))
def test_entropy_rate_interval_covers_the_markov_rate(seed: int) -> None:
    source = MarkovSource(seed)
    estimate = estimate_entropy_rate(source, sequences=40, length=60, seed=seed,
                                     confidence=0.99)
    truth = source.block_entropy_per_token(60)
    assert estimate.entropy_rate.covers(truth)
    assert estimate.sampled_surprisal.covers(truth)


def test_trend_detects_a_decreasing_series_and_not_noise() -> None:
    rng = np.random.default_rng(2)
    falling = np.linspace(6, 3, 400) + rng.normal(0, 1, 400)
    assert trend(falling).decreasing()
    false_alarms = sum(trend(rng.normal(4, 1, 400)).decreasing() for _ in range(100))
    assert false_alarms <= 12  # a 5% test: about 2.5 expected (one-sided)


def test_percentile_interval_brackets_the_median() -> None:
    interval = percentile_interval(np.arange(101, dtype=np.float64), confidence=0.9)
    assert (interval.low, interval.estimate, interval.high) == pytest.approx((5.0, 50.0, 95.0))


def test_interval_rejects_an_estimate_outside_it() -> None:
    with pytest.raises(ValueError, match="excludes"):
        Interval(2.0, 0.0, 1.0, 0.95, "x")


def test_estimators_reject_too_few_samples() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        mean_interval(np.array([1.0]))
    with pytest.raises(ValueError, match="at least 2"):
        miller_madow_entropy(np.array([1]))
    with pytest.raises(ValueError, match="at least 4"):
        trend(np.array([1.0, 2.0]))

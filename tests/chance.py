"""Pass thresholds for statistical tests, derived so that each test fails by chance rarely.

A statistical test repeats a randomized experiment ``trials`` times and asserts that at least
``min_successes`` of them succeed. If one experiment succeeds with probability at least
``rate`` (a coverage measured by ``benchmarks/estimator_coverage.py`` and recorded in
``reports/estimator_coverage.md``), the test fails with probability at most ``budget``: the
binomial lower tail. A test whose hypothesis strategy runs it ``examples`` times splits the
budget between them.
"""

from __future__ import annotations

from scipy.stats import binom

# NOTE: one chance failure in 10,000 runs per statistical test, spread over at most this many
# hypothesis examples (the "ci" profile runs 60, "dev" 25).
FAILURE_BUDGET = 1e-4
MAX_EXAMPLES = 60


def min_successes(trials: int, rate: float, examples: int = MAX_EXAMPLES,
                  budget: float = FAILURE_BUDGET) -> int:
    """The largest m with P(Binomial(trials, rate) < m) <= budget / examples."""
    m = int(binom.ppf(budget / examples, trials, rate))
    while m > 0 and binom.cdf(m - 1, trials, rate) > budget / examples:
        m -= 1
    return m


def max_successes(trials: int, rate: float, examples: int = 1,
                  budget: float = FAILURE_BUDGET) -> int:
    """The smallest m with P(Binomial(trials, rate) > m) <= budget / examples."""
    return int(binom.isf(budget / examples, trials, rate))

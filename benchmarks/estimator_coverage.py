"""Coverage and width study of the checker's estimators, on sources whose answer is known.

Every interval the checker prints claims a confidence. This script measures, over many random
seeds, how often each interval covers the truth, including the regimes that broke the former
Miller-Madow interval (a rare symbol that is often unseen; a near-uniform binary source) and a
strongly autocorrelated series (AR(1), phi = 0.9, where an i.i.d. interval covers about a third
of the time), and how wide it is: the ``width ratio`` is the mean width over ``2 z RMSE``, the
width a calibrated normal interval would have given the estimate's root-mean-square error
against the truth (1 for such an interval; an interval of ``[0, log2 K]`` covers always and has
a ratio in the tens). It writes both to ``reports/estimator_coverage.md``. The tests in
``tests/test_checker_estimators.py`` set their coverage thresholds from the worst cell measured
here minus three Monte-Carlo standard errors, and their width thresholds from the widest ratio
measured here with a margin, so that each fails by chance less than once in 10,000 runs.

    python benchmarks/estimator_coverage.py [--sources 100] [--repeats 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy import stats

from seqkv.checker.estimators import Interval, dirichlet_entropy, mean_interval, trend
from seqkv.checker.known_sources import MarkovSource, ar1_series, entropy_bits
from seqkv.checker.sampling import estimate_entropy_rate
from seqkv.provenance import RunHeader, start_run


@dataclass(frozen=True)
class Cell:
    estimator: str
    source: str
    samples: int
    confidence: float
    intervals: int
    covered: int
    width_ratio: float | None = None  # mean width / (2 z RMSE of the estimate)

    @property
    def coverage(self) -> float:
        return self.covered / self.intervals

    @property
    def coverage_error(self) -> float:
        """The Monte-Carlo standard error of the measured coverage."""
        c = self.coverage
        return float(np.sqrt(max(c * (1 - c), 1e-12) / self.intervals))


class Widths:
    """Accumulates intervals against their truths for the width ratio."""

    def __init__(self) -> None:
        self.widths: list[float] = []
        self.errors: list[float] = []

    def add(self, interval: Interval, truth: float) -> bool:
        self.widths.append(interval.high - interval.low)
        self.errors.append(interval.estimate - truth)
        return interval.covers(truth)

    def ratio(self, confidence: float) -> float:
        z = stats.norm.ppf(0.5 + confidence / 2)
        rmse = float(np.sqrt(np.mean(np.square(self.errors))))
        return float(np.mean(self.widths)) / (2 * z * rmse) if rmse > 0 else float("inf")


def _entropy_cell(name: str, draw_p: object, k: int, n: int, confidence: float, sources: int,
                  repeats: int, rng: np.random.Generator) -> Cell:
    covered = 0
    widths = Widths()
    for _ in range(sources):
        p = draw_p(rng) if callable(draw_p) else np.asarray(draw_p, dtype=np.float64)
        truth = entropy_bits(p)
        for _ in range(repeats):
            symbols = rng.choice(k, size=n, p=p)
            interval = dirichlet_entropy(symbols, k, confidence, seed=int(rng.integers(2**31)))
            covered += widths.add(interval, truth)
    return Cell("dirichlet_entropy", name, n, confidence, sources * repeats, covered,
                widths.ratio(confidence))


def entropy_cells(sources: int, repeats: int, rng: np.random.Generator) -> list[Cell]:
    cells = []
    fixed: list[tuple[str, npt.NDArray[np.float64], int]] = [
        ("K=2, rare symbol p=3e-4", np.array([3e-4, 1 - 3e-4]), 4000),
        ("K=2, rare symbol p=1e-4", np.array([1e-4, 1 - 1e-4]), 4000),
        ("K=2, rare symbol p=1e-3", np.array([1e-3, 1 - 1e-3]), 500),
        ("K=2, p=0.49 (near uniform)", np.array([0.49, 0.51]), 4000),
        ("K=2, p=0.5 (uniform)", np.array([0.5, 0.5]), 4000),
        ("K=8, uniform", np.full(8, 1 / 8), 4000),
        ("K=8, support of 3 (5 never seen)", np.array([0.5, 0.3, 0.2, 0, 0, 0, 0, 0]), 4000),
        ("K=8, one symbol p=1 - 7e-4", np.array([1 - 7e-4, *[1e-4] * 7]), 4000),
    ]
    for confidence in (0.95, 0.99):
        for name, p, n in fixed:
            cells.append(_entropy_cell(name, p, p.size, n, confidence, 1, sources * repeats // 4,
                                       rng))
        for k in (2, 4, 12, 64):
            for alpha in (0.1, 1.0):
                def draw(g: np.random.Generator, k: int = k, alpha: float = alpha) -> object:
                    return g.dirichlet(np.full(k, alpha))
                cells.append(_entropy_cell(f"K={k}, p ~ Dirichlet({alpha:g})", draw, k, 4000,
                                           confidence, sources, max(1, repeats // 4), rng))
    return cells


def mean_cells(repeats: int, rng: np.random.Generator) -> list[Cell]:
    """Batch-means t-interval on i.i.d. surprisal and on autocorrelated AR(1) series."""
    cells = []
    p = rng.dirichlet(np.ones(50))
    truth = entropy_bits(p)
    for size in (200, 500, 2000):
        widths = Widths()
        covered = sum(widths.add(mean_interval(-np.log2(p[rng.choice(50, size=size, p=p)])),
                                 truth) for _ in range(repeats))
        cells.append(Cell("mean_interval", "i.i.d. surprisal, 50 symbols", size, 0.95, repeats,
                          covered, widths.ratio(0.95)))
    for phi in (0.5, 0.9):
        for size in (500, 2000):
            widths = Widths()
            covered = sum(widths.add(mean_interval(ar1_series(rng, size, phi) + 4.0), 4.0)
                          for _ in range(repeats))
            cells.append(Cell("mean_interval", f"AR(1) phi={phi:g} series", size, 0.95, repeats,
                              covered, widths.ratio(0.95)))
    return cells


def rate_cells(repeats: int, rng: np.random.Generator) -> list[Cell]:
    rate, surprisal = Widths(), Widths()
    covered = covered_surprisal = 0
    for _ in range(repeats):
        source = MarkovSource(int(rng.integers(2**31)))
        estimate = estimate_entropy_rate(source, sequences=40, length=60,
                                         seed=int(rng.integers(2**31)), confidence=0.99)
        truth = source.block_entropy_per_token(60)
        covered += rate.add(estimate.entropy_rate, truth)
        covered_surprisal += surprisal.add(estimate.sampled_surprisal, truth)
    return [Cell("estimate_entropy_rate.entropy_rate", "8-symbol Markov chains", 40 * 60, 0.99,
                 repeats, covered, rate.ratio(0.99)),
            Cell("estimate_entropy_rate.sampled_surprisal", "8-symbol Markov chains", 40 * 60,
                 0.99, repeats, covered_surprisal, surprisal.ratio(0.99))]


def trend_cells(repeats: int, rng: np.random.Generator) -> list[Cell]:
    """The trend test's size: how often pure noise is called decreasing (one-sided 2.5%)."""
    quiet = sum(not trend(rng.normal(4, 1, 400)).decreasing() for _ in range(repeats))
    return [Cell("trend (no false alarm)", "i.i.d. N(4, 1), 400 positions", 400, 0.975,
                 repeats, quiet)]


def render(cells: list[Cell], header: RunHeader, seconds: float) -> str:
    lines = [
        "# Coverage of the checker's estimators",
        "",
        header.markdown(),
        "",
        f"Measured in {seconds:.0f} s. Each row: intervals "
        "computed on fresh random samples of a source whose answer is known, the fraction "
        "that covered it (with its Monte-Carlo standard error) and the width ratio: mean width "
        "over 2 z RMSE of the estimate against the truth (about 1 for a calibrated interval). "
        "Where a row's coverage is below its stated confidence, the interval is optimistic "
        "there. The tests set their coverage thresholds from the worst row of each estimator "
        "minus three standard errors, and their width thresholds from the widest ratio.",
        "",
        "| estimator | source | samples | stated | intervals | measured coverage | width ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for cell in cells:
        ratio = "-" if cell.width_ratio is None else f"{cell.width_ratio:.2f}"
        lines.append(f"| `{cell.estimator}` | {cell.source} | {cell.samples:,} | "
                     f"{cell.confidence:.1%} | {cell.intervals:,} | {cell.coverage:.2%} "
                     f"(± {cell.coverage_error:.2%}) | {ratio} |")
    for confidence in (0.95, 0.99):
        worst = min((c for c in cells if c.estimator == "dirichlet_entropy"
                     and c.confidence == confidence), key=lambda c: c.coverage)
        lines.append("")
        lines.append(f"Worst `dirichlet_entropy` cell at {confidence:.0%}: {worst.source}, "
                     f"{worst.coverage:.2%}.")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", default="reports/estimator_coverage.md")
    args = parser.parse_args()
    command = (f"python benchmarks/estimator_coverage.py --sources {args.sources} "
               f"--repeats {args.repeats} --seed {args.seed}")
    header = start_run("none (sources whose answer is known)",
                       f"random samples drawn with seed {args.seed}", command)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    cells = [*entropy_cells(args.sources, args.repeats, rng),
             *mean_cells(args.sources * 10, rng), *rate_cells(args.sources * 2, rng),
             *trend_cells(args.sources * 20, rng)]
    seconds = time.perf_counter() - started
    Path(args.report).write_text(render(cells, header.finished(), seconds))
    print(json.dumps([asdict(c) | {"coverage": c.coverage, "coverage_error": c.coverage_error}
                      for c in cells]))


if __name__ == "__main__":
    main()

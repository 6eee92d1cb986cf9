"""The timing history of one machine profile, as a markdown report and a plot.

Run by ``scripts/bench.sh`` after the timed benchmarks (``bench_ratios.py``); also its helper
for the profile key and for whether a history exists:

    python benchmarks/timing_report.py key
    python benchmarks/timing_report.py has-history benchmarks/history/KEY
    python benchmarks/timing_report.py report --history benchmarks/history/KEY --threshold T \\
        [--latest RUN.json] --markdown reports/benchmarks.md --plot reports/benchmarks.png

The report holds the latest comparison (for each ratio: the median of the run it was compared
with, the latest median, the change, the threshold and the verdict, computed as
pytest-benchmark's ``--benchmark-compare-fail=median:T%`` computes it), the run-to-run spread
of every ratio over the recorded runs (what the threshold is calibrated against), the runs with
their load, and a plot of every ratio over the runs.

Invariants:
1. A ratio fails when ``100 * (latest / baseline - 1) > threshold``, pytest-benchmark's
   percentage check on the median (enforced: :func:`compare`; the gate itself is
   pytest-benchmark's).
2. The baseline of a run is the newest recorded run before it: the run ``--benchmark-compare``
   loads (enforced: :func:`latest_pair`; ``scripts/bench.sh`` passes ``--latest`` only for a
   run it did not record).
3. The report and the plot are written only from saved JSON runs; nothing is measured here
   (enforced).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ratio_timing import history_runs, missing_history_message, timing_profile_key


@dataclass(frozen=True)
class RatioPoint:
    """One ratio in one run: its statistics over the run's rounds, in reference units."""

    key: str  # pytest-benchmark's fullname: what --benchmark-compare matches on
    label: str
    median: float
    low: float  # the smallest round
    high: float  # the largest round
    rounds: int
    reference: str
    reference_seconds: float
    loadavg_1m: float | None


@dataclass(frozen=True)
class Run:
    """One saved pytest-benchmark run (``number`` None: a run that was not recorded)."""

    number: int | None
    path: str
    datetime: str
    commit: str
    dirty: bool
    cpu: str
    model: str
    points: tuple[RatioPoint, ...]

    @property
    def name(self) -> str:
        return f"{self.number:04d}" if self.number is not None else "latest (not recorded)"

    def point(self, key: str) -> RatioPoint | None:
        return next((p for p in self.points if p.key == key), None)

    @property
    def mean_load(self) -> float | None:
        loads = [p.loadavg_1m for p in self.points if p.loadavg_1m is not None]
        return statistics.fmean(loads) if loads else None


@dataclass(frozen=True)
class Comparison:
    label: str
    baseline: float
    latest: float
    delta_percent: float
    threshold_percent: float

    @property
    def passed(self) -> bool:
        return self.delta_percent <= self.threshold_percent


@dataclass(frozen=True)
class Spread:
    """A ratio over the recorded runs: the largest increase any run shows over any other is
    what a comparison of two runs of unchanged code can see."""

    label: str
    runs: int
    low: float
    median: float
    high: float

    @property
    def largest_increase_percent(self) -> float:
        return 100 * (self.high / self.low - 1)


def load_run(path: Path, number: int | None) -> Run:
    data = json.loads(path.read_text())
    points = []
    for bench in data["benchmarks"]:
        stats, extra = bench["stats"], bench.get("extra_info", {})
        points.append(RatioPoint(
            key=bench["fullname"], label=str(extra.get("ratio", bench["name"])),
            median=float(stats["median"]), low=float(stats["min"]), high=float(stats["max"]),
            rounds=int(stats["rounds"]), reference=str(extra.get("reference", "seconds")),
            reference_seconds=float(extra.get("reference_seconds", 1.0)),
            loadavg_1m=extra.get("loadavg_1m")))
    commit = data.get("commit_info", {})
    cpu = data.get("machine_info", {}).get("cpu", {})
    first = data["benchmarks"][0].get("extra_info", {}) if data["benchmarks"] else {}
    return Run(number, str(path), str(data.get("datetime", "")), str(commit.get("id", "?"))[:9],
               bool(commit.get("dirty", False)),
               f"{cpu.get('brand_raw', '?')}, {cpu.get('count', '?')} CPUs",
               str(first.get("model", "?")), tuple(points))


def load_history(profile_dir: Path) -> list[Run]:
    """The recorded runs of a profile on this machine id, oldest first."""
    return [load_run(path, int(path.name[:4])) for path in history_runs(profile_dir)]


def latest_pair(history: Sequence[Run], latest: Run | None) -> tuple[Run | None, Run | None]:
    """(baseline, latest) as ``--benchmark-compare`` pairs them: a run that was not recorded
    (``latest``) against the newest recorded run; else the newest recorded run against the one
    before it."""
    if latest is not None:
        return (history[-1] if history else None), latest
    if not history:
        return None, None
    return (history[-2] if len(history) > 1 else None), history[-1]


def compare(baseline: Run, latest: Run, threshold_percent: float) -> list[Comparison]:
    """Every ratio of ``latest`` that ``baseline`` also has, in ``latest``'s order."""
    rows = []
    for point in latest.points:
        old = baseline.point(point.key)
        if old is not None:
            rows.append(Comparison(point.label, old.median, point.median,
                                   100 * (point.median / old.median - 1), threshold_percent))
    return rows


def spreads(history: Sequence[Run]) -> list[Spread]:
    """The spread of every ratio's median over the recorded runs, in the newest run's order."""
    if not history:
        return []
    rows = []
    for point in history[-1].points:
        values = [p.median for run in history if (p := run.point(point.key)) is not None]
        rows.append(Spread(point.label, len(values), min(values), statistics.median(values),
                           max(values)))
    return rows


def _load(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def render_markdown(history: Sequence[Run], baseline: Run | None, latest: Run | None,
                    threshold_percent: float, profile: str, plot_name: str | None) -> str:
    lines = ["# Timing ratios: history and the latest comparison", ""]
    if latest is None:
        return "\n".join([*lines, f"No runs of profile `{profile}` yet.", ""])
    example = latest.points[0] if latest.points else None
    lines += [
        "Measured by `scripts/bench.sh` (`benchmarks/bench_ratios.py`; this report by "
        "`benchmarks/timing_report.py`). Every timing is a ratio to a reference operation "
        "timed in the same session on one thread, so it means the same on a busy or an idle "
        "machine of the same kind; pytest-benchmark stores and compares the ratios themselves "
        "(its timer counts in units of the reference).",
        "",
        f"Profile `{profile}`: {latest.cpu}; model {latest.model}"
        + (f"; {example.reference} = {example.reference_seconds:.3f} s in the latest run"
           if example is not None else "") + ".",
        "",
        f"Gate: a ratio fails when its median exceeds the compared run's median by more than "
        f"**{threshold_percent:g}%** (`--benchmark-compare-fail=median:{threshold_percent:g}%`, "
        "set in `scripts/bench.sh` from the spread below). Faster is never a failure.",
        "",
    ]
    if baseline is None:
        lines += [f"Latest run {latest.name} ({latest.datetime}): first of this profile, "
                  "nothing to compare with.", ""]
    else:
        rows = compare(baseline, latest, threshold_percent)
        failed = [row for row in rows if not row.passed]
        lines += [
            f"## Latest comparison: run {latest.name} against {baseline.name}",
            "",
            f"{latest.name}: {latest.datetime}, commit {latest.commit}"
            f"{' (uncommitted changes)' if latest.dirty else ''}, mean 1-minute load "
            f"{_load(latest.mean_load)}. {baseline.name}: {baseline.datetime}, mean load "
            f"{_load(baseline.mean_load)}. Verdict: "
            + ("**pass**" if not failed else f"**FAIL** ({len(failed)} ratios)") + ".",
            "",
            "| ratio | baseline median | latest median | delta | threshold | result |",
            "|---|---:|---:|---:|---:|---|",
            *(f"| {row.label} | {row.baseline:.4g} | {row.latest:.4g} | "
              f"{row.delta_percent:+.1f}% | +{row.threshold_percent:g}% | "
              f"{'pass' if row.passed else '**FAIL**'} |" for row in rows),
            "",
        ]
    spread_rows = spreads(history)
    if spread_rows:
        worst = max(spread_rows, key=lambda s: s.largest_increase_percent)
        lines += [
            f"## Run-to-run spread over the {len(history)} recorded runs",
            "",
            "Every recorded run on this machine, whatever code it ran (the Runs table names each "
            "commit): a ratio whose path changed between runs shows that change here too. The "
            "largest increase is the largest ratio of one run's median to another's, minus 1. "
            f"Largest: {worst.largest_increase_percent:.1f}% ({worst.label}).",
            "",
            "| ratio | runs | min | median | max | largest increase |",
            "|---|---:|---:|---:|---:|---:|",
            *(f"| {s.label} | {s.runs} | {s.low:.4g} | {s.median:.4g} | {s.high:.4g} | "
              f"{s.largest_increase_percent:.1f}% |" for s in spread_rows),
            "",
        ]
    lines += ["## Runs", "", "| run | date (UTC) | commit | mean 1-minute load |",
              "|---|---|---|---:|"]
    shown = list(history) + ([latest] if latest.number is None else [])
    lines += [f"| {run.name} | {run.datetime[:19]} | {run.commit}"
              f"{' (dirty)' if run.dirty else ''} | {_load(run.mean_load)} |" for run in shown]
    if plot_name is not None:
        lines += ["", f"![every ratio over the runs]({plot_name})"]
    return "\n".join(lines) + "\n"


def plot(history: Sequence[Run], baseline: Run | None, latest: Run | None,
         threshold_percent: float, path: Path) -> None:
    """One panel per ratio: its median (bar: fastest to slowest round) in every recorded run,
    the latest run if not recorded (hollow), and the failure line above the baseline."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = list(history) + ([latest] if latest is not None and latest.number is None else [])
    if not runs:
        return
    order = runs[-1].points
    columns = 3
    rows = -(-len(order) // columns)
    figure = Figure(figsize=(4.2 * columns, 2.8 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, point in enumerate(order):
        ax = axes[index // columns][index % columns]
        for x, run in enumerate(runs, start=1):
            p = run.point(point.key)
            if p is None:
                continue
            ax.errorbar([x], [p.median], yerr=[[p.median - p.low], [p.high - p.median]],
                        fmt="o", color="C0", mfc="white" if run.number is None else "C0",
                        capsize=3)
        old = baseline.point(point.key) if baseline is not None else None
        if old is not None:
            ax.axhline(old.median * (1 + threshold_percent / 100), color="C3", ls="--", lw=1,
                       label=f"fails above (+{threshold_percent:g}%)")
            ax.legend(loc="lower left", fontsize=7)
        ax.set_title(point.label, fontsize=9)
        ax.set_xticks(range(1, len(runs) + 1), [run.name[:4] for run in runs], fontsize=7)
        ax.set_ylabel(f"x {point.reference}", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylim(bottom=0)
    for index in range(len(order), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    figure.suptitle("Timing ratios per run (median; bar: fastest to slowest round)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("key", help="print this machine's timing profile key (loads the model)")
    has = commands.add_parser("has-history", help="exit 0 if the profile has recorded runs")
    has.add_argument("history", type=Path)
    report = commands.add_parser("report", help="write the markdown report and the plot")
    report.add_argument("--history", type=Path, required=True)
    report.add_argument("--threshold", type=float, required=True, help="percent")
    report.add_argument("--latest", type=Path, default=None,
                        help="the JSON (--benchmark-json) of a run that was not recorded")
    report.add_argument("--markdown", type=Path, required=True)
    report.add_argument("--plot", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "key":
        from seqkv.models import load_default_model

        print(timing_profile_key(load_default_model()))
        return 0
    if args.command == "has-history":
        if history_runs(args.history):
            return 0
        print(missing_history_message(args.history), file=sys.stderr)
        return 1
    history = load_history(args.history)
    latest = (load_run(args.latest, None) if args.latest is not None and args.latest.is_file()
              else None)
    baseline, latest = latest_pair(history, latest)
    plot(history, baseline, latest, args.threshold, args.plot)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    plot_name = (str(args.plot.relative_to(args.markdown.parent))
                 if args.plot.is_relative_to(args.markdown.parent) else str(args.plot))
    args.markdown.write_text(render_markdown(history, baseline, latest, args.threshold,
                                             args.history.name, plot_name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

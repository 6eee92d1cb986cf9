"""The timing gate of the test command: a few low-noise ratios, compared with recorded runs.

Seconds measured on a shared machine change with its load; a ratio of two operations measured
next to each other changes much less, because load slows both. So every figure here is an
operation's time over one float prefill of the same tokens run just before it (``RATIOS``: the
encode and decode of the integer level ``portable`` and of the model-free level ``ngram``), each
the median over ``rounds`` paired rounds. A run is compared with the median of the last ``k``
recorded clean runs (runs of a committed tree) of this machine's timing profile, and fails when
a ratio exceeds that median by more than its threshold.

Thresholds come from the measured spread: a ratio's threshold is ``SPREAD_MULTIPLE`` times the
robust relative spread of its recorded runs' medians, within ``[MIN_THRESHOLD,
MAX_THRESHOLD]``. The upper limit is below 1, so a 2x slowdown of any gated operation always
fails. On a profile with no recorded history, the gate first records ``k`` runs of the code under
test into a temporary history and compares a further run with them: it then cannot know the
code's past speed, but it runs every ratio, proves its comparison, and would catch a slowdown
that appears within the run (an operation that grows slower as the process ages).

Self-test: ``SEQKV_TIMING_INJECT='encode[portable]=2'`` makes the gate sleep after the named
operation for (factor - 1) times its duration, a slowdown the gate must catch
(``tests/test_timing_gate.py``; docs/guides/checks.md, *Regression gates*).

Invariants:
1. Every timed round divides by a reference run made just before it, in the same process
   (enforced by ``measure``).
2. ``--record`` refuses a tree with uncommitted changes (enforced: ``record_run``), so the
   history holds clean runs only and names their commits.
3. A run never compares with a history of another timing profile (enforced: files are keyed by
   ``timing_profile``).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from seqkv import environment
from seqkv.bench.figures import baselines_root
from seqkv.bench.texts import shipped_text
from seqkv.errors import SeqKVError
from seqkv.models.adapter import CausalLM
from seqkv.schedule import cpu_model
from seqkv.skv import compress, decompress

RATIOS = ("encode[portable]", "decode[portable]", "encode[ngram]", "decode[ngram]")
# NOTE: 96 tokens of prose, the figures gate's first case: long enough that timer resolution and
# Python overhead are noise beside each operation, short enough that one run of every ratio
# stays a short gate.
TIMING_TOKENS = 96
DEFAULT_ROUNDS = 5
HISTORY_RUNS = 3  # k: the last k clean runs make the baseline
SPREAD_MULTIPLE = 4.0
MIN_THRESHOLD = 0.25
MAX_THRESHOLD = 0.6
INJECT_ENV = "SEQKV_TIMING_INJECT"
HISTORY_ENV = "SEQKV_TIMING_HISTORY"  # "none": ignore the recorded history (temporary mode)


class TimingGateError(SeqKVError):
    """The timing gate cannot run as asked (e.g. ``--record`` on an uncommitted tree)."""


def timing_profile() -> str:
    """The kind of machine a timing history belongs to: the CPU (vendor, family, model), its
    core count, and the torch version. Timings, unlike integer figures, do depend on the CPU
    model."""
    parts = [cpu_model(), f"{os.cpu_count()}cpu", f"torch{torch.__version__}"]
    return re.sub(r"[^A-Za-z0-9.]+", "-", "-".join(parts)).strip("-").lower()


def history_root() -> Path:
    return baselines_root().parent / "timing"


def history_path(profile: str, root: Path | None = None) -> Path:
    return (history_root() if root is None else root) / f"{profile}.jsonl"


@dataclass(frozen=True)
class TimingRun:
    """One run of every ratio: each ratio's paired samples (operation / reference)."""

    profile: str
    commit: str
    clean: bool
    recorded: str  # UTC time
    rounds: int
    load_1m: float
    samples: dict[str, tuple[float, ...]]

    def median(self, ratio: str) -> float:
        return float(statistics.median(self.samples[ratio]))


def parse_injections(text: str | None) -> dict[str, float]:
    """``'encode[portable]=2,decode[ngram]=1.5'`` -> factors; unknown names are an error."""
    factors: dict[str, float] = {}
    for item in filter(None, (text or "").split(",")):
        name, _, value = item.partition("=")
        if name not in RATIOS:
            raise TimingGateError(f"{INJECT_ENV}: unknown ratio {name!r}; choose from "
                                  f"{', '.join(RATIOS)}")
        try:
            factors[name] = float(value)
        except ValueError:
            raise TimingGateError(f"{INJECT_ENV}: {item!r} is not NAME=FACTOR") from None
        if not factors[name] >= 1.0:
            raise TimingGateError(f"{INJECT_ENV}: a slowdown factor must be at least 1")
    return factors


def time_token_by_token(model: CausalLM, tokens: Sequence[int]) -> float:
    """Seconds of plain token-by-token transformers steps over ``tokens`` (generation's cost,
    no coding), on the current thread count: what ``seqkv demo`` and the benches compare a
    decode with."""
    stepper = model.new_stepper()
    started = time.perf_counter()
    for token in tokens:
        stepper.step(token)
    return time.perf_counter() - started


def _operations(model: CausalLM, tokens: list[int]) -> dict[str, Callable[[], object]]:
    """The timed operations, on files coded once here (from the tokens alone, as the figures
    gate codes the integer levels)."""
    files = {level: compress(model, tokens, level=level).data for level in ("portable", "ngram")}
    return {
        "encode[portable]": lambda: compress(model, tokens, level="portable"),
        "decode[portable]": lambda: decompress(model, files["portable"]),
        "encode[ngram]": lambda: compress(model, tokens, level="ngram"),
        "decode[ngram]": lambda: decompress(model, files["ngram"]),
    }


def _timed(operation: Callable[[], object], factor: float) -> float:
    started = time.perf_counter()
    operation()
    elapsed = time.perf_counter() - started
    if factor > 1.0:
        time.sleep((factor - 1.0) * elapsed)
    return time.perf_counter() - started


def measure(model: CausalLM, rounds: int = DEFAULT_ROUNDS, ratios: Sequence[str] = RATIOS,
            inject: Mapping[str, float] | None = None) -> TimingRun:
    """Every ratio over ``rounds`` rounds; in each round each operation runs right after its own
    reference prefill, the operations in a fixed order."""
    tokens = model.encode_text(shipped_text("prose"))[:TIMING_TOKENS]
    operations = _operations(model, tokens)
    factors = parse_injections(os.environ.get(INJECT_ENV)) if inject is None else dict(inject)
    for operation in operations.values():  # warm-up: native builds, buffers, caches
        operation()
    samples: dict[str, list[float]] = {name: [] for name in ratios}
    for _ in range(rounds):
        for name in ratios:
            reference = _timed(lambda: model.prefill(tokens), 1.0)
            samples[name].append(_timed(operations[name], factors.get(name, 1.0)) / reference)
    commit, clean = _git_state()
    return TimingRun(timing_profile(), commit, clean,
                     datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), rounds,
                     os.getloadavg()[0], {k: tuple(v) for k, v in samples.items()})


def _git_state() -> tuple[str, bool]:
    """The commit of the source tree and whether it is clean ("unknown", False outside git).
    The timing history itself does not count: the runs being recorded change it."""
    source = Path(__file__).resolve().parents[3]
    paths = ["."]
    if history_root().resolve().is_relative_to(source):
        paths.append(f":(exclude){history_root().resolve().relative_to(source)}")
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True,
                                text=True, check=True, timeout=30).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=source,
                                capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    return commit, not status.strip()


def read_history(path: Path) -> list[TimingRun]:
    """The recorded runs of one profile, oldest first (none when the file does not exist)."""
    if not path.is_file():
        return []
    runs = []
    for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            row["samples"] = {k: tuple(float(x) for x in v) for k, v in row["samples"].items()}
            runs.append(TimingRun(**row))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise TimingGateError(f"{path}:{number} is not a timing run: {error}") from error
    return runs


def append_run(path: Path, run: TimingRun) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    row = asdict(run) | {"samples": {k: list(v) for k, v in run.samples.items()}}
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row, sort_keys=True) + "\n")


def record_run(path: Path, run: TimingRun) -> None:
    """Append ``run`` to a committed history; refuses a run of an uncommitted tree."""
    if not run.clean:
        raise TimingGateError(
            f"refusing to record a timing run of a tree with uncommitted changes (commit "
            f"{run.commit[:12]}): commit first, so the history holds clean runs only")
    append_run(path, run)


@dataclass(frozen=True)
class RatioVerdict:
    name: str
    baseline: float  # median of the last k clean runs' medians
    current: float
    spread: float  # robust relative spread of those medians
    threshold: float  # allowed relative excess

    @property
    def change(self) -> float:
        return self.current / self.baseline - 1.0

    @property
    def passed(self) -> bool:
        return self.change <= self.threshold


@dataclass(frozen=True)
class TimingVerdict:
    profile: str
    history: str  # "recorded (N runs)" or "temporary (k runs of this code)"
    compared_with: tuple[str, ...]  # the commits of the runs compared with
    ratios: tuple[RatioVerdict, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.ratios)

    def render(self) -> str:
        lines = [f"timing gate, profile {self.profile}, history {self.history}: "
                 + ("PASS" if self.passed else "FAIL"),
                 "| ratio (to one prefill) | baseline | now | change | threshold | |",
                 "|---|---:|---:|---:|---:|---|"]
        for r in self.ratios:
            lines.append(f"| {r.name} | {r.baseline:.3f} | {r.current:.3f} | {r.change:+.1%} | "
                         f"{r.threshold:.0%} | {'ok' if r.passed else '**SLOWER**'} |")
        return "\n".join(lines)


def threshold(spread: float) -> float:
    return float(np.clip(SPREAD_MULTIPLE * spread, MIN_THRESHOLD, MAX_THRESHOLD))


def relative_spread(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation of ``log(values)``: a robust relative standard
    deviation (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    logs = np.log(np.asarray(values, dtype=np.float64))
    return float(1.4826 * np.median(np.abs(logs - np.median(logs))))


def compare(history: Sequence[TimingRun], current: TimingRun, kind: str,
            k: int = HISTORY_RUNS) -> TimingVerdict:
    """``current`` against the median of the last ``k`` clean runs of ``history``."""
    clean = [run for run in history if run.clean][-k:]
    if not clean:
        raise TimingGateError("no clean run to compare with")
    verdicts = []
    for name in current.samples:
        medians = [run.median(name) for run in clean if name in run.samples]
        if not medians:
            raise TimingGateError(f"the history has no run of ratio {name}")
        # NOTE: the spread of a ratio's run medians, and of one run's rounds scaled to a median
        # of as many rounds: with few recorded runs the first alone would understate it.
        within = max(relative_spread(run.samples[name]) / np.sqrt(run.rounds)
                     for run in clean if name in run.samples)
        spread = max(relative_spread(medians), float(within))
        verdicts.append(RatioVerdict(name, float(statistics.median(medians)),
                                     current.median(name), spread, threshold(spread)))
    return TimingVerdict(current.profile, kind, tuple(run.commit[:12] for run in clean),
                         tuple(verdicts))


def run_gate(model: CausalLM, rounds: int = DEFAULT_ROUNDS, root: Path | None = None,
             log: Callable[[str], None] | None = None) -> tuple[TimingVerdict, list[TimingRun]]:
    """The gate as the test command runs it: against this profile's recorded history, or, where
    there is none (or ``SEQKV_TIMING_HISTORY=none``), against ``HISTORY_RUNS`` runs recorded
    first into a temporary history. Returns the verdict and the history compared with."""
    profile = timing_profile()
    history = [] if environment.choice(HISTORY_ENV, ("none",)) == "none" else read_history(
        history_path(profile, root))
    kind = f"recorded ({len(history)} runs)"
    if not [run for run in history if run.clean]:
        kind = f"temporary ({HISTORY_RUNS} runs of this code, none recorded for this profile)"
        history = []
        for index in range(HISTORY_RUNS):
            if log is not None:
                log(f"timing gate: no history for {profile}: temporary run {index + 1} of "
                    f"{HISTORY_RUNS}")
            history.append(_as_clean(measure(model, rounds, inject={})))
    current = measure(model, rounds)
    return compare(history, current, kind), history


def _as_clean(run: TimingRun) -> TimingRun:
    """A run of a temporary history counts as clean: it ran the code under test."""
    return TimingRun(run.profile, run.commit, True, run.recorded, run.rounds, run.load_1m,
                     run.samples)

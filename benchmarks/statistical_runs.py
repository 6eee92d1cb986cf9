"""Run the checker's statistical tests many times, each under a fresh random hypothesis seed.

The statistical tests (``tests/test_checker_estimators.py``) assert that an interval covers a
known truth often enough; their thresholds (``tests/chance.py``) are set so that one test fails by
chance at most once in 10,000 runs. CI runs them derandomized, which cannot show that rate; this
script draws a new seed per run and counts passes and failures, recording each failing seed and
its report, so that a threshold that is too tight shows up as failures.

    python benchmarks/statistical_runs.py [--runs 500] [--minutes 30] [-k EXPR]
                                          [--log reports/statistical_runs.jsonl]

Invariants:
1. Every run uses its own seed, drawn from the operating system's entropy, passed as
   ``--hypothesis-seed`` (checked: the seed is printed and logged with the run's outcome).
2. Runs are independent: the hypothesis example database is off (profile ``stats-nodb``: the
   ``dev`` profile's settings without a database), so a failure is not replayed by later runs
   (enforced by loading that profile through ``HYPOTHESIS_PROFILE`` before pytest reads it).
3. The script stops after ``--runs`` runs or once ``--minutes`` have passed, whichever is first,
   and says how many ran (enforced).

Runs happen in this one process (``pytest.main`` per run) because starting Python and importing
torch costs ~30 s per run on the shared 2-core machine, more than the tests themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings

PROFILE = "stats-nodb"
TEST_FILE = "tests/test_checker_estimators.py"


@dataclass(frozen=True)
class Failure:
    nodeid: str
    report: str  # pytest's long representation, truncated


@dataclass(frozen=True)
class Run:
    index: int
    seed: int
    exit_code: int
    passed: int
    failures: tuple[Failure, ...]
    seconds: float


@dataclass
class _Collector:
    """A pytest plugin that counts one run's passed and failed test calls."""

    passed: int = 0
    failures: list[Failure] = field(default_factory=list)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed:
            self.failures.append(Failure(report.nodeid, str(report.longrepr)[-4000:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("-k", default="", help="pytest -k expression selecting tests")
    parser.add_argument("--log", default="reports/statistical_runs.jsonl")
    args = parser.parse_args()
    settings.register_profile(PROFILE, max_examples=25, deadline=None, database=None)
    os.environ["HYPOTHESIS_PROFILE"] = PROFILE
    os.environ.pop("CI", None)
    deadline = time.monotonic() + 60 * args.minutes
    runs: list[Run] = []
    with Path(args.log).open("w", encoding="utf-8") as log:
        for index in range(args.runs):
            if time.monotonic() >= deadline:
                break
            seed = secrets.randbits(32)
            collector = _Collector()
            started = time.perf_counter()
            argv = ["-p", "no:cacheprovider", "-q", "--no-header",
                    TEST_FILE, f"--hypothesis-seed={seed}"]
            if args.k:
                argv += ["-k", args.k]
            code = int(pytest.main(argv, plugins=[collector]))
            run = Run(index, seed, code, collector.passed, tuple(collector.failures),
                      time.perf_counter() - started)
            runs.append(run)
            log.write(json.dumps(asdict(run)) + "\n")
            log.flush()
            print(f"run {index} seed {seed}: exit {code}, {run.passed} passed, "
                  f"{len(run.failures)} failed, {run.seconds:.1f} s", flush=True)
    failed = [r for r in runs if r.exit_code != 0]
    print(json.dumps({"runs": len(runs), "passed_runs": len(runs) - len(failed),
                      "failed_runs": len(failed), "failed_seeds": [r.seed for r in failed],
                      "minutes": sum(r.seconds for r in runs) / 60,
                      "profile": settings.get_current_profile_name(),
                      "k": args.k}))


if __name__ == "__main__":
    main()

"""The timing gate bites: a slowed ratio fails the comparison, an unslowed rerun passes.

``scripts/bench.sh`` gates the codec's timing ratios with pytest-benchmark
(``--benchmark-compare --benchmark-compare-fail=median:T%``, T read from that script) against a
recorded history, through the timer and fixture of ``benchmarks/ratio_timing.py``. These tests
run the same machinery in subprocesses on ``benchmarks/gate_probe.py``, a ratio of two sleeps
(steady under load), with its history in a temporary directory. The report's arithmetic
(``benchmarks/timing_report.py``) is checked on the runs they record.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
PROBE = BENCHMARKS / "gate_probe.py"
PROFILE = "probe-profile"


def _threshold_percent() -> float:
    """The gate's threshold, as scripts/bench.sh states it."""
    found = re.search(r"^threshold_percent=(\d+(?:\.\d+)?)$",
                      (ROOT / "scripts" / "bench.sh").read_text(), re.M)
    assert found is not None, "scripts/bench.sh must set threshold_percent=N"
    return float(found.group(1))


def _probe(storage: Path, *options: str, slowdown: float = 0.0
           ) -> subprocess.CompletedProcess[str]:
    """pytest on the probe, timed, with its history under ``storage``."""
    env = {**os.environ, "SEQKV_GATE_PROBE_SLOWDOWN": str(slowdown)}
    command = [sys.executable, "-m", "pytest", str(PROBE), f"--confcutdir={BENCHMARKS}",
               "-p", "no:cacheprovider", "-q", "--benchmark-enable",
               f"--benchmark-storage=file://{storage / PROFILE}", *options]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _gate(storage: Path, slowdown: float = 0.0) -> subprocess.CompletedProcess[str]:
    return _probe(storage, "--benchmark-compare",
                  f"--benchmark-compare-fail=median:{_threshold_percent():g}%",
                  slowdown=slowdown)


def _runs(storage: Path) -> list[Path]:
    return sorted((storage / PROFILE).glob("*/[0-9][0-9][0-9][0-9]_*.json"))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A history of one unslowed probe run."""
    storage = tmp_path_factory.mktemp("history")
    result = _probe(storage, "--benchmark-autosave")
    assert result.returncode == 0, result.stdout + result.stderr
    return storage


def test_recorded_statistics_are_in_reference_units(recorded: Path) -> None:
    (run,) = _runs(recorded)
    (bench,) = json.loads(run.read_text())["benchmarks"]
    # The probe sleeps twice the reference's sleep: about 2 units (0.1 if stored in seconds).
    assert 1.8 < bench["stats"]["median"] < 2.4
    assert bench["extra_info"]["ratio"] == "probe / sleep"
    assert bench["options"]["timer"] == "PairedReference(name='sleep')"
    assert len(bench["extra_info"]["reference_samples"]) == bench["stats"]["rounds"]


def test_slowed_ratio_fails_the_comparison_naming_it(recorded: Path) -> None:
    result = _gate(recorded, slowdown=3.0)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert re.search(r"Performance has regressed:\s+test_probe_ratio\b.*'median' has failed",
                     output), output


def test_unslowed_rerun_passes(recorded: Path) -> None:
    result = _gate(recorded)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Performance has regressed" not in result.stdout + result.stderr


def test_missing_history_fails_naming_profile_and_record_command(tmp_path: Path) -> None:
    result = _gate(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert f"no timing history for profile '{PROFILE}'" in output
    assert "`scripts/bench.sh --record`" in output


@pytest.fixture
def report(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import timing_report

    return timing_report


def test_report_compares_as_the_gate_does(recorded: Path, tmp_path: Path,
                                          report: ModuleType) -> None:
    latest_json = tmp_path / "latest.json"
    result = _probe(recorded, f"--benchmark-json={latest_json}", slowdown=3.0)
    assert result.returncode == 0, result.stdout + result.stderr
    history = report.load_history(recorded / PROFILE)
    baseline, latest = report.latest_pair(history, report.load_run(latest_json, None))
    assert baseline is history[-1] and latest.number is None
    (row,) = report.compare(baseline, latest, 25.0)
    assert row.delta_percent == pytest.approx(300.0, abs=40.0)
    assert not row.passed
    text = report.render_markdown(history, baseline, latest, 25.0, PROFILE, "plot.png")
    assert "| probe / sleep |" in text and "**FAIL**" in text
    report.plot(history, baseline, latest, 25.0, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratio_timing_doctests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import ratio_timing

    failures, tried = doctest.testmod(ratio_timing)
    assert tried > 0 and failures == 0

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

from seqkv.bench import timing
from seqkv.models import CausalLM

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


# The timing gate of the test command (seqkv.bench.timing): ratios measured here, compared
# with this profile's recorded history, or a temporary one where none is recorded.

TIMING_VERDICT = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def timing_gate(real_model: CausalLM, pytestconfig: pytest.Config
                ) -> tuple[timing.TimingVerdict, list[timing.TimingRun]]:
    verdict, history = timing.run_gate(real_model)
    pytestconfig.stash[TIMING_VERDICT] = verdict.render()
    return verdict, history


@pytest.mark.real_model
def test_timing_ratios_hold_against_the_history(
        timing_gate: tuple[timing.TimingVerdict, list[timing.TimingRun]]) -> None:
    verdict, _ = timing_gate
    assert [r.name for r in verdict.ratios] == list(timing.RATIOS)
    assert verdict.passed, verdict.render()


@pytest.mark.real_model
def test_an_injected_2x_slowdown_of_an_encode_fails_the_gate(
        real_model: CausalLM,
        timing_gate: tuple[timing.TimingVerdict, list[timing.TimingRun]]) -> None:
    """Against the same history the gate just passed: the recorded one on a recorded profile,
    the temporary one elsewhere."""
    _, history = timing_gate
    slowed = timing.measure(real_model, ratios=("encode[portable]",),
                            inject={"encode[portable]": 2.0})
    verdict = timing.compare(history, slowed, "the gate's")
    assert [r.name for r in verdict.ratios if not r.passed] == ["encode[portable]"], (
        verdict.render())


def _run(samples: dict[str, tuple[float, ...]], clean: bool = True,
         commit: str = "c" * 40) -> timing.TimingRun:
    return timing.TimingRun("p", commit, clean, "t", len(next(iter(samples.values()))), 0.0,
                            samples)


def test_compare_takes_the_median_of_the_last_k_clean_runs() -> None:
    history = [_run({"r": (9.0,) * 5}, commit="old"), _run({"r": (9.0,) * 5}, clean=False),
               *(_run({"r": (v,) * 5}, commit=f"run{i}") for i, v in enumerate((1.0, 1.1, 1.2,
                                                                                1.0)))]
    verdict = timing.compare(history, _run({"r": (1.2,) * 5}), "test", k=3)
    (ratio,) = verdict.ratios
    assert verdict.compared_with == ("run1", "run2", "run3")
    assert ratio.baseline == 1.1 and ratio.current == 1.2 and ratio.passed


def test_a_2x_ratio_fails_whatever_the_spread() -> None:
    noisy = [_run({"r": (1.0, 2.0, 0.5, 1.5, 0.7)}), _run({"r": (3.0,) * 5}),
             _run({"r": (0.4,) * 5})]
    verdict = timing.compare(noisy, _run({"r": (2.0 * 1.0,) * 5}), "test")
    (ratio,) = verdict.ratios
    assert ratio.threshold == timing.MAX_THRESHOLD < 1.0 and not ratio.passed


def test_quiet_history_gives_the_minimum_threshold() -> None:
    quiet = [_run({"r": (1.0, 1.01, 0.99, 1.0, 1.0)}) for _ in range(3)]
    (ratio,) = timing.compare(quiet, _run({"r": (1.2,) * 5}), "test").ratios
    assert ratio.threshold == timing.MIN_THRESHOLD and ratio.passed


def test_record_refuses_an_uncommitted_tree(tmp_path: Path) -> None:
    with pytest.raises(timing.TimingGateError, match="uncommitted"):
        timing.record_run(tmp_path / "h.jsonl", _run({"r": (1.0,)}, clean=False))
    assert not (tmp_path / "h.jsonl").exists()


def test_history_round_trips_and_names_a_damaged_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    run = _run({"r": (1.0, 2.0)})
    timing.record_run(path, run)
    assert timing.read_history(path) == [run]
    path.write_text(path.read_text() + "{}\n")
    with pytest.raises(timing.TimingGateError, match=r"h\.jsonl:2"):
        timing.read_history(path)


@pytest.mark.parametrize("text, message", [("decode[tokens]=2", "unknown ratio"),
                                           ("encode[portable]", "NAME=FACTOR"),
                                           ("encode[portable]=0.5", "at least 1")])
def test_injections_are_validated(text: str, message: str) -> None:
    with pytest.raises(timing.TimingGateError, match=re.escape(message)):
        timing.parse_injections(text)

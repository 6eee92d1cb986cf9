"""The run header every report opens with (``seqkv.provenance``): its commit in a git checkout
and ``unknown`` without one, the load average, the CPU path; and every generator under
``benchmarks/`` and ``research/`` that writes a ``reports/*.md`` calls it.

Each guard has a mutant beside its test: the guard monkeypatched away (``_git`` that lets
git's absence through) or the defect fed in (a generator whose call is removed), and the test's
check shown to catch it.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from report_generators import calls_start_run
from seqkv import provenance
from seqkv.errors import IntegerBackendError
from seqkv.models.integer import native
from seqkv.provenance import RunHeader, command_line, commit, headed, start_run
from test_readme_figures import header_gaps

ROOT = Path(__file__).resolve().parents[1]
SHORT_HASH = r"[0-9a-f]{4,40}"


def _git(folder: Path, *words: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *words], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout of one commit holding one tracked file."""
    folder = tmp_path / "checkout"
    folder.mkdir()
    _git(folder, "init", "-q")
    (folder / "tracked.txt").write_text("one\n")
    _git(folder, "add", "tracked.txt")
    _git(folder, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m",
         "one")
    return folder


def test_the_commit_of_a_checkout_is_its_short_head(checkout: Path) -> None:
    assert commit(checkout) == _git(checkout, "rev-parse", "--short", "HEAD")
    assert re.fullmatch(SHORT_HASH, commit(checkout))


def test_a_changed_tracked_file_marks_the_commit_dirty(checkout: Path) -> None:
    (checkout / "untracked.md").write_text("a report being written\n")
    assert not commit(checkout).endswith("+dirty")  # untracked files do not count
    (checkout / "tracked.txt").write_text("two\n")
    assert commit(checkout) == _git(checkout, "rev-parse", "--short", "HEAD") + "+dirty"


def test_this_repository_states_its_commit() -> None:
    assert re.fullmatch(rf"{SHORT_HASH}(\+dirty)?", commit())


def _commit_without_git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    monkeypatch.setenv("PATH", str(tmp_path / "no-binaries"))  # no git on PATH
    return commit(ROOT)


def test_without_git_the_commit_is_unknown(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    assert _commit_without_git(monkeypatch, tmp_path) == "unknown"


def test_the_guard_against_a_missing_git_is_what_keeps_the_header_alive(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Mutant: ``_git`` without its except clause; git's absence then escapes as an OSError.
    def unguarded(root: Path, *words: str) -> str | None:
        done = subprocess.run(["git", "-C", str(root), *words], capture_output=True,
                              text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    monkeypatch.setattr(provenance, "_git", unguarded)
    with pytest.raises(FileNotFoundError):
        _commit_without_git(monkeypatch, tmp_path)


def test_outside_a_checkout_the_commit_is_unknown(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert commit(tmp_path) == "unknown"


def test_a_git_that_hangs_reads_as_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float | None] = []

    def hangs(*args: object, timeout: float | None = None, **kwargs: object) -> None:
        calls.append(timeout)
        raise subprocess.TimeoutExpired("git", timeout or 0.0)

    monkeypatch.setattr(subprocess, "run", hangs)
    assert commit(ROOT) == "unknown"
    assert calls == [provenance.GIT_TIMEOUT_S]  # bounded: git is never waited on unboundedly


def test_the_header_states_the_load_at_the_start_and_the_end() -> None:
    header = start_run("SmolLM2-135M-Instruct", "the sample", "python x.py")
    assert header.load_start is not None and len(header.load_start) == 3
    assert header.load_end is None
    assert "at the end" not in header.markdown()
    finished = header.finished()
    assert finished.load_end is not None and len(finished.load_end) == 3
    line = next(line for line in finished.markdown().splitlines() if "load average" in line)
    assert re.fullmatch(r"- load average \(1, 5, 15 min\): [\d.]+ [\d.]+ [\d.]+ at the start, "
                        r"[\d.]+ [\d.]+ [\d.]+ at the end", line)


def test_a_platform_without_a_load_average_reads_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def none() -> tuple[float, float, float]:
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", none)
    header = start_run("m", "d", "c").finished()
    assert header.load_start is None and header.load_end is None
    assert "unavailable at the start, unavailable at the end" in header.markdown()


def test_the_cpu_path_is_the_integer_forwards_and_a_bad_setting_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    status = native.status()
    expected = "the torch statement" if status.isa is None else status.isa
    assert provenance.cpu_path() == f"integer forward on {expected} ({status.reason})"

    def refused() -> native.NativeStatus:
        raise IntegerBackendError("SEQKV_INTEGER_ISA='mmx' is not accepted")

    monkeypatch.setattr(native, "status", refused)
    assert provenance.cpu_path() == "unknown (SEQKV_INTEGER_ISA='mmx' is not accepted)"

    def unbuilt() -> native.NativeStatus:
        raise RuntimeError("native.c did not build")

    monkeypatch.setattr(native, "status", unbuilt)
    assert provenance.cpu_path() == "unknown (native.c did not build)"


def test_the_command_line_reads_as_typed(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert command_line(["/venv/bin/python3", "-m", "research.bench", "decode", "--tokens",
                         "200"]) == "python -m research.bench decode --tokens 200"
    assert command_line(["/venv/bin/python", "/venv/bin/seqkv", "check", "a b.txt"]) == (
        "seqkv check 'a b.txt'")
    assert command_line(["python", str(tmp_path / "benchmarks" / "x.py"), "--out",
                         "/elsewhere/r.md"]) == "python benchmarks/x.py --out /elsewhere/r.md"
    assert command_line([]) == "unknown"


def test_the_header_round_trips_through_json() -> None:
    header = start_run("m", "d", "c").finished()
    assert RunHeader.from_json_dict(json.loads(json.dumps(header.to_json_dict()))) == header


def test_a_headed_report_states_every_provenance_field() -> None:
    header = start_run("SmolLM2-135M-Instruct", "the sample", "python benchmarks/x.py")
    body = "# Title\n\nA paragraph.\n" + "\n".join(f"line {n}" for n in range(30))
    report = headed(body, header.finished())
    assert report.startswith("# Title\n\n- command: `python benchmarks/x.py`\n")
    assert "\n\nA paragraph.\n" in report
    assert header_gaps(report) == frozenset()
    # Mutant: the body alone (the header left out) misses the fields the header states.
    assert header_gaps(body) == {"model", "command", "machine", "load", "commit"}
    assert headed("no title\n", header).startswith("- command: ")


# Generators that name a ``reports/*.md`` but need no header of their own, and why.
NOT_GENERATORS = {
    "benchmarks/bench_ratios.py": "names reports/decode_levels.md in a comment; writes none",
    "benchmarks/timing_report.py": "renders scripts/bench.sh's pytest-benchmark history, "
                                   "where each run's commit, load and machine are that run's "
                                   "own record (its Runs table)",
    "research/bench/__init__.py": "the package's docstring lists its reports",
    "research/bench/decode.py": "renders; research/bench/cli.py writes it under the header",
    "research/bench/mix.py": "renders; research/bench/cli.py writes it under the header",
    "research/decoding/__init__.py": "names reports/decode_levels.md in its docstring",
}
REPORT_NAMED = re.compile(r"reports/[\w.+-]+\.md|\"reports\"\s*[/)]")


def generators_without_header(sources: dict[str, str]) -> list[str]:
    """The files (repository-relative) that name a report they may write and never call
    ``seqkv.provenance.start_run``."""
    return sorted(path for path, source in sources.items()
                  if REPORT_NAMED.search(source) and path not in NOT_GENERATORS
                  and not calls_start_run(source))


def _generator_sources() -> dict[str, str]:
    files = [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("research/**/*.py")]
    return {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in files
            if "tests" not in path.relative_to(ROOT).parts}


def test_every_report_generator_calls_the_shared_header() -> None:
    sources = _generator_sources()
    assert generators_without_header(sources) == []
    for path in NOT_GENERATORS:  # the exemptions stay true: each still names a report
        assert REPORT_NAMED.search(sources[path]), path
    # The generators behind the README's figures are among those checked.
    assert {"benchmarks/restore_vs_zstd.py", "benchmarks/fleet_restore.py",
            "benchmarks/check_cost.py", "benchmarks/residual_drift.py",
            "benchmarks/vllm_connector.py", "benchmarks/integer_paths.py",
            "research/bench/cli.py"} <= {path for path, source in sources.items()
                                         if REPORT_NAMED.search(source)}


def test_a_generator_without_the_header_call_is_caught() -> None:
    sources = _generator_sources()
    path = "benchmarks/fleet_restore.py"
    mutant = sources[path].replace("start_run(", "begin_run(")
    assert mutant != sources[path]
    assert generators_without_header({**sources, path: mutant}) == [path]


# Generators whose render takes an empty measurement: each report opens with every field the
# README's provenance check asks for.
EMPTY_RENDERS: dict[str, Callable[[ModuleType, RunHeader], str]] = {
    "fleet_restore": lambda module, header: module.render([], header, "portable"),
    "check_cost": lambda module, header: module.render([], header),
    "model_free_decode": lambda module, header: module.markdown([], None, header),
    "decode_under_load": lambda module, header: module.render([], header, "Level portable"),
    "exact_layouts": lambda module, header: module.render([], {"prose": 3}, header),
    "long_checks": lambda module, header: module.render(header, {}),
}


@pytest.mark.parametrize("name", sorted(EMPTY_RENDERS))
def test_a_generators_report_opens_with_the_header(name: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # their imports of each other
    module = importlib.import_module(name)
    header = start_run("SmolLM2-135M-Instruct", "generated", f"python benchmarks/{name}.py")
    report = EMPTY_RENDERS[name](module, header.finished())
    assert header_gaps(report) == frozenset()
    assert header.commit in report and "at the end" in report


def test_the_vllm_report_lists_each_runs_own_commit_and_load(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = importlib.import_module("vllm_connector")
    header = start_run("m", "d", "python benchmarks/vllm_runs.py none").finished()
    lines = module.render_run_headers({"none": {"header": header.to_json_dict(), "ttft": {}},
                                       "example": {"ttft": {}}})
    assert f"| none | {header.commit} | {header.load()} |" in lines
    # A run recorded before the header says so rather than borrowing the renderer's facts.
    assert "| example | not recorded (a run older than its header) | |" in lines


def test_a_status_git_cannot_read_is_never_called_clean(checkout: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    head = _git(checkout, "rev-parse", "--short", "HEAD")
    real = subprocess.run

    def status_fails(args: list[str], **kwargs: object) -> object:
        if "status" in args:
            raise subprocess.TimeoutExpired("git", 1.0)
        return real(args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "run", status_fails)
    assert commit(checkout) == f"{head}+unknown-status"

"""Timings as ratios to a reference operation, stored and compared by pytest-benchmark.

Motivation: seconds measured on a shared machine change with its load, so a gate on seconds
either fails on every busy afternoon or is too loose to catch anything. A ratio of two
operations measured next to each other, on the same thread count, changes much less: load slows
both. So every tracked timing is a ratio (an encode against one plain prefill of the same
tokens, a decode against plain token-by-token steps, ...), and pytest-benchmark itself stores
and compares the ratios: a benchmark's timer is a :class:`PairedReference`, which runs the
reference operation once before every round (pytest-benchmark's ``setup``, untimed) and then
counts ``time.perf_counter()`` in units of that run. Every round pytest-benchmark records is
therefore one paired ratio (operation / the reference run just before it), every statistic it
saves (min, median, ...) is in reference units, and ``--benchmark-compare`` with
``--benchmark-compare-fail=median:X%`` gates the ratios directly.

NOTE: pairing each round with its own reference run, rather than dividing by one reference
median measured at the start of the session, was measured to matter here: on the shared 2-core
machine (load 3-4.5) a session-wide reference of token-by-token steps came out at 20.2 s while
the tokens-level decode of the same 128 tokens, a few minutes later, took 10.3 s: a ratio of
0.51 for two operations of equal cost, because the load had changed in between.

History layout: ``benchmarks/history/<profile key>/<pytest-benchmark machine id>/NNNN_*.json``
(pytest-benchmark's ``--benchmark-autosave`` files under ``--benchmark-storage``), one profile
per kind of machine (:func:`timing_profile_key`).

Invariants:
1. A ratio benchmark's timer is set before pytest-benchmark builds the fixture, so its saved
   statistics are in reference units (enforced by :func:`time_ratio`, which marks the test and
   only then requests ``benchmark``; checked by ``tests/test_timing_gate.py``).
2. Every timed round divides by a reference run made just before it, in the same process and
   on the same thread count as the caller set (enforced: ``setup`` runs the reference, and
   pytest-benchmark calls it before every round, outside the timed region).
3. Asking to compare against a history that does not exist fails the session, naming the
   profile and the command that records it (enforced by :func:`require_history`, a
   ``pytest_configure`` hook of ``benchmarks/conftest.py``); pytest-benchmark alone would only
   warn.

:class:`PairedReference` appends to its own ``samples``; :func:`time_ratio` adds a
``benchmark`` marker to the test item; nothing else here mutates state.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import pytest
from pytest_benchmark.utils import get_machine_id as _untyped_machine_id

if TYPE_CHECKING:
    from seqkv.models import CausalLM

RECORD_COMMAND = "scripts/bench.sh --record"
HISTORY_ROOT = Path("benchmarks") / "history"
RUN_GLOB = "[0-9][0-9][0-9][0-9]_*.json"


_T = TypeVar("_T")


class Benchmark(Protocol):
    """The parts of pytest-benchmark's (untyped) ``BenchmarkFixture`` the benchmarks use."""

    extra_info: dict[str, object]

    def pedantic(self, target: Callable[[], _T], *, setup: Callable[[], None] | None,
                 rounds: int, warmup_rounds: int) -> _T: ...


def get_machine_id() -> str:
    """pytest-benchmark's machine id, the folder of a storage its runs are saved in."""
    return cast(Callable[[], str], _untyped_machine_id)()


@dataclass(frozen=True, slots=True)
class PairedReference:
    """A pytest-benchmark timer whose unit is the latest run of a reference operation.

    ``measure`` (the benchmark's ``setup``) runs the reference once and appends its seconds to
    ``samples``; the timer then reads ``time.perf_counter()`` divided by that last sample. Its
    ``repr`` is what pytest-benchmark saves as the benchmark's ``options.timer``.

    >>> import time
    >>> reference = PairedReference("sleep", lambda: time.sleep(0.01))
    >>> reference.measure()
    >>> start = reference()
    >>> time.sleep(0.02)
    >>> 1.0 < reference() - start < 50.0
    True
    """

    name: str
    operation: Callable[[], object] = field(repr=False)
    samples: list[float] = field(default_factory=list, repr=False)

    def measure(self) -> None:
        started = time.perf_counter()
        self.operation()
        self.samples.append(time.perf_counter() - started)

    def __call__(self) -> float:
        assert self.samples, "the reference runs (setup) before every timed round"
        return time.perf_counter() / self.samples[-1]


def timing_enabled(config: pytest.Config) -> bool:
    """Whether this session times benchmarks (pytest-benchmark's rule for its public options:
    ``--benchmark-disable``, which the project's ``addopts`` sets, unless ``--benchmark-enable``
    is given)."""
    disabled = bool(config.getoption("benchmark_disable"))
    return not disabled or bool(config.getoption("benchmark_enable"))


def time_ratio(request: pytest.FixtureRequest, reference: PairedReference | None, ratio: str,
               group: str, operation: Callable[[], _T], rounds: int, warmup_rounds: int = 0,
               extra: Mapping[str, object] | None = None) -> _T:
    """Time ``operation`` over ``rounds`` rounds, each in units of a run of ``reference`` made
    just before it, as this test's pytest-benchmark benchmark; return its last result.

    ``reference`` is None when timing is disabled (``operation`` then runs once, untimed).
    ``ratio`` names the tracked ratio in reports (``extra_info["ratio"]``), ``group`` is
    pytest-benchmark's table group, ``extra`` more fields for ``extra_info``.
    """
    if reference is not None:
        request.node.add_marker(pytest.mark.benchmark(timer=reference, group=group),
                                append=False)
    benchmark: Benchmark = request.getfixturevalue("benchmark")
    result = benchmark.pedantic(operation, setup=None if reference is None else reference.measure,
                                rounds=rounds, warmup_rounds=warmup_rounds)
    benchmark.extra_info.update(ratio=ratio, loadavg_1m=os.getloadavg()[0], **(extra or {}))
    if reference is not None:
        benchmark.extra_info.update(reference=reference.name,
                                    reference_seconds=statistics.median(reference.samples),
                                    reference_samples=list(reference.samples))
    return result


def storage_dir(config: pytest.Config) -> Path | None:
    """The directory of ``--benchmark-storage`` (None for a non-file storage)."""
    storage = str(config.getoption("benchmark_storage"))
    if "://" in storage and not storage.startswith("file://"):
        return None
    return Path(storage.removeprefix("file://")).expanduser().absolute()


def history_runs(profile_dir: Path) -> list[Path]:
    """The saved runs of one profile that pytest-benchmark compares against on this machine
    (its machine id: OS, Python implementation and version), oldest first."""
    return sorted((profile_dir / get_machine_id()).glob(RUN_GLOB))


def missing_history_message(profile_dir: Path) -> str:
    shown = os.path.relpath(profile_dir)
    return (f"no timing history for profile {profile_dir.name!r} on {get_machine_id()} "
            f"(looked in {os.path.join(shown, get_machine_id())}): record it with "
            f"`{RECORD_COMMAND}` and commit {shown}")


def require_history(config: pytest.Config) -> None:
    """Fail the session (``pytest.UsageError``) when ``--benchmark-compare`` has nothing to
    compare with."""
    if not config.getoption("benchmark_compare"):
        return
    profile_dir = storage_dir(config)
    if profile_dir is not None and not history_runs(profile_dir):
        raise pytest.UsageError(missing_history_message(profile_dir))


def timing_profile_key(model: CausalLM) -> str:
    """The kind of machine a timing history belongs to.

    The figures gate's execution profile (CPU vendor, family and model; torch's CPU capability;
    the calibrated row block; torch and transformers versions), plus the CPU count (the
    references and the coding run on one thread, but the rest of the process and the machine's
    other work share the cores) and, where CUDA is present, the GPU's name (the kernel ratios).
    """
    import torch

    from seqkv.bench.figures import profile_key

    parts = [profile_key(model), f"{os.cpu_count()}cpu"]
    if torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name())
    return re.sub(r"[^A-Za-z0-9.]+", "-", "-".join(parts)).strip("-").lower()

"""Fixtures shared by the tests: one private redis-server per module, and model-free levels
coding as an earlier release (the tiny model behind a whitespace tokenizer, ``use_tiny``, is the
root ``conftest.py``'s)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from native_paths import CPU_ISAS
from seqkv.levels import model_free, parse_level
from seqkv.models.integer import native
from seqkv.store.backends.redis_server import RedisServer


@pytest.fixture
def as_earlier_release(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Makes a model-free level (``ngram``, ``plain``) code as releases before the prefill
    schedule did: its KV on the row-invariant forward, ``rows`` in its profile; until
    ``monkeypatch.undo()``."""
    def patch(level: str) -> None:
        kind = type(parse_level(level))
        spec = kind.spec.fget  # type: ignore[attr-defined]
        monkeypatch.setattr(model_free, "KV_SCHEDULE", "rows")
        monkeypatch.setattr(kind, "spec", property(lambda self: replace(
            spec(self), schedule="rows", former_schedules=())))
    return patch


@pytest.fixture(scope="module", params=CPU_ISAS)
def isa(request: pytest.FixtureRequest) -> native.Isa:
    path: native.Isa = request.param
    return path


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    """Which deterministic figures this run gated exactly, which not, and why; the timing
    gate's table."""
    from test_figures_gate import GATE_REPORT
    from test_timing_gate import TIMING_VERDICT

    report = config.stash.get(GATE_REPORT, None)
    if report is not None:
        terminalreporter.section("deterministic figures gate")
        terminalreporter.write_line(report.render())
    verdict = config.stash.get(TIMING_VERDICT, None)
    if verdict is not None:
        terminalreporter.section("timing gate")
        terminalreporter.write_line(verdict)

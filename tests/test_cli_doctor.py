"""``seqkv doctor`` reports where seqkv runs: the integer path, the float profile and whether the
figures gate holds a baseline for it, the model cache and Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from native_paths import CPU_ISAS
from seqkv.cli import main
from seqkv.models import CausalLM
from seqkv.models.integer import native

KEYS = {"integer_isa", "integer_isas", "integer_forced", "integer_reason", "cpu",
        "float_profile", "float_figures_gated", "float_nearest_profile", "model_cache",
        "model_cached", "redis_server"}


def _doctor(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["doctor", "--json"]) == 0
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


@pytest.fixture
def fresh_native(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """native.load's choice made again under this test's environment (no path forced by the
    caller's), and forgotten after."""
    monkeypatch.delenv(native.ISA_ENV, raising=False)
    monkeypatch.delenv(native.BACKEND_ENV, raising=False)
    native.load.cache_clear()
    yield monkeypatch
    native.load.cache_clear()


def test_doctor_names_the_best_path_and_a_forced_one(
        use_tiny: CausalLM, capsys: pytest.CaptureFixture[str],
        fresh_native: pytest.MonkeyPatch) -> None:
    report = _doctor(capsys)
    assert set(report) == KEYS
    assert report["integer_isas"] == list(CPU_ISAS)
    assert report["integer_isa"] == CPU_ISAS[0] and report["integer_forced"] is None
    assert isinstance(report["float_figures_gated"], bool)
    fresh_native.setenv(native.ISA_ENV, "scalar")
    native.load.cache_clear()
    forced = _doctor(capsys)
    assert (forced["integer_isa"], forced["integer_forced"]) == ("scalar", "scalar")
    assert forced["integer_reason"] == f"forced by {native.ISA_ENV}"


def test_doctor_says_when_the_torch_statement_runs_and_refuses_a_lacking_path(
        use_tiny: CausalLM, capsys: pytest.CaptureFixture[str],
        fresh_native: pytest.MonkeyPatch) -> None:
    fresh_native.setenv(native.BACKEND_ENV, "torch")
    report = _doctor(capsys)
    assert report["integer_isa"] is None
    assert report["integer_reason"] == f"{native.BACKEND_ENV}=torch"
    fresh_native.delenv(native.BACKEND_ENV)
    lacking = next(isa for isa in native.ISAS if isa not in CPU_ISAS)
    fresh_native.setenv(native.ISA_ENV, lacking)
    native.load.cache_clear()
    assert main(["doctor"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"seqkv: error: {native.ISA_ENV}={lacking}: this CPU")
    assert error.count("\n") == 1

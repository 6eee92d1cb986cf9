"""The deterministic gate: every level's figures equal the committed baseline of this profile,
and a one-bit change in any figure fails it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import seqkv.bench.figures as gate
from seqkv.cli import main
from seqkv.models import CausalLM

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def gate_figures(real_model: CausalLM) -> list[gate.LevelFigures]:
    return gate.measure_figures(real_model)


@pytest.mark.real_model
def test_figures_equal_the_committed_baseline(real_model: CausalLM,
                                              gate_figures: list[gate.LevelFigures]) -> None:
    key = gate.profile_key(real_model)
    baseline = gate.read_baseline(gate.baseline_path(key, REPO / gate.BASELINE_DIR))
    changes = gate.compare_figures(baseline, gate_figures)
    assert not changes, gate.render_changes(changes, key)


def _figure_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(gate.LevelFigures) if f.name not in ("text",
                                                                                     "level")]


def _one_bit(value: int | str) -> int | str:
    if isinstance(value, int):
        return value ^ 1
    return value[:-1] + ("0" if value[-1] != "0" else "1")


@pytest.mark.parametrize("name", _figure_fields())
def test_a_one_bit_change_in_any_figure_fails_the_gate(name: str) -> None:
    row = gate.LevelFigures("prose", "tokens", 96, "ab" * 32, 466, 60, 0, 1506, 97, 97)
    changed = dataclasses.replace(row, **{name: _one_bit(getattr(row, name))})
    changes = gate.compare_figures([row], [changed])
    assert [(c.figure, c.old, c.new) for c in changes] == [
        (name, getattr(row, name), getattr(changed, name))]
    assert name in gate.render_changes(changes, "profile")


def test_a_missing_or_extra_level_fails_the_gate() -> None:
    row = gate.LevelFigures("prose", "tokens", 96, "ab" * 32, 466, 60, 0, 1506, 97, 97)
    other = dataclasses.replace(row, level="rows")
    assert {c.level for c in gate.compare_figures([row], [row, other])} == {"rows"}
    assert {c.level for c in gate.compare_figures([row, other], [row])} == {"rows"}


def test_a_profile_without_baseline_names_it_and_the_record_command(tmp_path: Path) -> None:
    with pytest.raises(gate.MissingBaselineError, match="some-cpu") as error:
        gate.read_baseline(gate.baseline_path("some-cpu", tmp_path))
    assert gate.RECORD_COMMAND in str(error.value)


@pytest.mark.real_model
def test_the_cli_gate_exits_1_on_a_changed_figure_and_records(
    real_model: CausalLM, gate_figures: list[gate.LevelFigures], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(gate, "measure_figures", lambda model: gate_figures)
    monkeypatch.setattr("seqkv.cli.common.load", lambda path: real_model)
    assert main(["bench", "figures", "--record", "--baselines", str(tmp_path)]) == 0
    assert main(["bench", "figures", "--baselines", str(tmp_path)]) == 0
    path = gate.baseline_path(gate.profile_key(real_model), tmp_path)
    altered = [dataclasses.replace(gate_figures[0], code_bits=gate_figures[0].code_bits ^ 1),
               *gate_figures[1:]]
    gate.write_baseline(path, gate.profile_key(real_model), real_model, altered)
    capsys.readouterr()
    assert main(["bench", "figures", "--baselines", str(tmp_path)]) == 1
    output = capsys.readouterr().out
    assert "code_bits" in output and ("| +1 |" in output or "| -1 |" in output)

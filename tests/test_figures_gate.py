"""The deterministic gate: the integer levels' figures equal their one baseline on every machine,
the float levels' equal this profile's baseline where one is recorded (and are reported, not
failed, where none is), and a one-bit change in any figure fails."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import seqkv.bench.figures as gate
from native_paths import CPU_ISAS
from seqkv.cli import main
from seqkv.levels.portable import integer_predictor
from seqkv.models import CausalLM, load_default_model
from seqkv.models.integer import native

GATE_REPORT = pytest.StashKey[gate.GateReport]()


@pytest.fixture(scope="session")
def gate_figures(real_model: CausalLM) -> list[gate.LevelFigures]:
    return gate.measure_figures(real_model)


@pytest.fixture(scope="session")
def gate_report(real_model: CausalLM, gate_figures: list[gate.LevelFigures],
                pytestconfig: pytest.Config) -> gate.GateReport:
    """The gate's verdict on this machine, kept for the run's summary (tests/conftest.py)."""
    report = gate.gate(real_model, gate_figures)
    pytestconfig.stash[GATE_REPORT] = report
    return report


@pytest.mark.real_model
def test_integer_figures_equal_the_one_baseline(gate_report: gate.GateReport) -> None:
    assert gate_report.integer_rows == 17  # 4 texts x 4 integer levels + the whole sample
    assert not gate_report.integer_changes, gate_report.render()


@pytest.mark.real_model
@pytest.mark.parametrize("path", CPU_ISAS[1:])
def test_integer_figures_equal_the_one_baseline_on_every_other_path(
        path: native.Isa, monkeypatch: pytest.MonkeyPatch) -> None:
    """The integer rows again with each other path of native.c this CPU runs forced (the best
    one is gated above): every instruction set gives the committed integers."""
    monkeypatch.setenv(native.ISA_ENV, path)
    native.load.cache_clear()
    try:
        model = load_default_model()  # its own integer predictors, built on the forced path
        cases = [case for case in gate.GATE_CASES if gate.dependence(case.level) == "integer"]
        figures = gate.measure_figures(model, cases)
        assert integer_predictor(model).isa == path
    finally:
        native.load.cache_clear()
    baseline = gate.read_baseline(gate.integer_baseline_path(gate.baselines_root()))
    changes = gate.compare_figures(baseline.rows, figures)
    assert len(figures) == 17 and not changes, gate.render_changes(changes, path)


@pytest.mark.real_model
def test_float_figures_equal_this_profiles_baseline_or_are_reported_as_not_gated(
        gate_report: gate.GateReport) -> None:
    """Gated exactly where this profile's baseline is recorded; elsewhere every float row was
    still measured, and the report says it is not gated, naming the profile."""
    assert gate_report.float_rows == 12  # 4 texts x 3 float levels
    if gate_report.float_gated:
        assert gate_report.float_changes == (), gate_report.render()
    else:
        line = gate_report.render().splitlines()[1]
        assert f"NOT GATED on this profile ({gate_report.float_profile.key})" in line


def _figure_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(gate.LevelFigures) if f.name not in ("text",
                                                                                     "level")]


def _one_bit(value: int | str) -> int | str:
    if isinstance(value, int):
        return value ^ 1
    return value[:-1] + ("0" if value[-1] != "0" else "1")


ROW = gate.LevelFigures("prose", "portable", 96, "ab" * 32, 466, 0, 0, 91, 2, 97)


@pytest.mark.parametrize("name", _figure_fields())
def test_a_one_bit_change_in_any_figure_fails_the_gate(name: str) -> None:
    changed = dataclasses.replace(ROW, **{name: _one_bit(getattr(ROW, name))})
    changes = gate.compare_figures([ROW], [changed])
    assert [(c.figure, c.old, c.new) for c in changes] == [
        (name, getattr(ROW, name), getattr(changed, name))]
    assert name in gate.render_changes(changes, "title")


def test_a_missing_or_extra_level_fails_the_gate() -> None:
    other = dataclasses.replace(ROW, level="ngram")
    assert {c.level for c in gate.compare_figures([ROW], [ROW, other])} == {"ngram"}
    assert {c.level for c in gate.compare_figures([ROW, other], [ROW])} == {"ngram"}


def test_levels_are_split_by_what_their_figures_depend_on() -> None:
    assert [gate.dependence(level) for level in gate.INTEGER_LEVELS] == ["integer"] * 4
    assert [gate.dependence(level) for level in gate.FLOAT_LEVELS] == ["float"] * 3
    assert gate.dependence("portable4") == gate.dependence("portable4:8") == "integer"
    assert gate.dependence("portable:8") == gate.dependence("portable+mix") == "integer"


def test_baselines_ship_in_the_package_not_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = gate.baselines_root()
    assert root.is_absolute() and gate.integer_baseline_path(root).is_file()
    profiles = [b.profile for b in gate.float_baselines(root)]
    assert profiles and all(p is not None for p in profiles)


def _profile(**changes: object) -> gate.FloatProfile:
    base = gate.FloatProfile("GenuineIntel", "AVX512", 16, "2.13.0+cpu", "5.24.0")
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_nearest_profile_differs_in_fewest_fields(tmp_path: Path) -> None:
    here = _profile(vendor="AuthenticAMD", row_block=4)
    far = _profile(vendor="AuthenticAMD", row_block=8, torch_version="2.9.1")
    near = _profile(row_block=4)
    baselines = []
    for profile in (far, near):
        path = tmp_path / f"{profile.key}.json"
        path.write_text(json.dumps({"profile": dataclasses.asdict(profile)}) + "\n")
        baselines.append(gate.read_baseline(path))
    nearest = gate.nearest_baseline(here, baselines)
    assert nearest is not None and nearest.profile == near
    assert here.differences(near) == ["vendor: AuthenticAMD vs GenuineIntel"]


@pytest.mark.real_model
def test_a_profile_without_float_baseline_is_reported_not_failed(
        real_model: CausalLM, gate_figures: list[gate.LevelFigures], tmp_path: Path) -> None:
    """A machine of no recorded float profile passes, naming itself, the nearest profile and
    its differences; the integer figures are still gated."""
    root = gate.baselines_root()
    shutil.copy(gate.integer_baseline_path(root), tmp_path / gate.INTEGER_BASELINE)
    (tmp_path / gate.FLOAT_FOLDER).mkdir()
    here = gate.float_profile(real_model)
    other = dataclasses.replace(here, row_block=here.row_block + 1)
    float_rows = [f for f in gate_figures if gate.dependence(f.level) == "float"]
    altered = [dataclasses.replace(float_rows[0], code_bits=float_rows[0].code_bits + 3),
               *float_rows[1:]]
    gate.write_baseline(tmp_path / gate.FLOAT_FOLDER / f"{other.key}.json", real_model,
                        altered, other, "elsewhere")
    report = gate.gate(real_model, gate_figures, tmp_path)
    text = report.render()
    assert report.passed and not report.float_gated
    assert f"NOT GATED on this profile ({here.key})" in text
    assert other.key in text and "row_block" in text
    assert [(c.figure, c.old, c.new) for c in report.nearest_changes] == [
        ("code_bits", float_rows[0].code_bits + 3, float_rows[0].code_bits)]


@pytest.mark.real_model
def test_a_one_bit_change_of_an_integer_figure_fails_on_every_profile(
        real_model: CausalLM, gate_figures: list[gate.LevelFigures], tmp_path: Path) -> None:
    """No float baseline for this profile (as on any unrecorded machine): the integer baseline
    still fails the gate, naming the row."""
    integer_rows = [f for f in gate_figures if gate.dependence(f.level) == "integer"]
    altered = [dataclasses.replace(integer_rows[0], code_bits=integer_rows[0].code_bits ^ 1),
               *integer_rows[1:]]
    gate.write_baseline(tmp_path / gate.INTEGER_BASELINE, real_model, altered, None, "test")
    report = gate.gate(real_model, gate_figures, tmp_path)
    assert not report.passed and not report.float_gated
    (change,) = report.integer_changes
    assert (change.text, change.level, change.figure) == (integer_rows[0].text,
                                                           integer_rows[0].level, "code_bits")
    assert "DIFFER" in report.render()


def test_a_missing_integer_baseline_names_itself(tiny_model: CausalLM, tmp_path: Path) -> None:
    with pytest.raises(gate.MissingBaselineError, match=r"integer\.json"):
        gate.gate(tiny_model, [], tmp_path)


def test_an_unreadable_baseline_is_named(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{not json\n")
    with pytest.raises(gate.CorruptFileError, match=r"x\.json"):
        gate.read_baseline(path)


@pytest.mark.real_model
def test_the_cli_gate_exits_1_on_a_changed_figure_and_records(
    real_model: CausalLM, gate_figures: list[gate.LevelFigures], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(gate, "measure_figures", lambda model: gate_figures)
    monkeypatch.setattr("seqkv.cli.common.load", lambda path: real_model)
    assert main(["bench", "figures", "--record", "--baselines", str(tmp_path)]) == 0
    assert main(["bench", "figures", "--baselines", str(tmp_path)]) == 0
    path = gate.integer_baseline_path(tmp_path)
    rows = list(gate.read_baseline(path).rows)
    rows[0] = dataclasses.replace(rows[0], code_bits=rows[0].code_bits ^ 1)
    gate.write_baseline(path, real_model, rows, None, "test")
    capsys.readouterr()
    assert main(["bench", "figures", "--baselines", str(tmp_path)]) == 1
    output = capsys.readouterr().out
    assert "code_bits" in output and ("| +1 |" in output or "| -1 |" in output)


@pytest.mark.real_model
def test_the_portable_reference_file_is_the_same_bytes_on_this_machine(
        real_model: CausalLM) -> None:
    """The portable promise, where it can fail: the sample coded here at ``portable`` equals the
    committed file byte for byte (recorded on another CPU), and that file decodes here."""
    from seqkv import decompress

    committed = (gate.baselines_root() / gate.REFERENCE_FILE).read_bytes()
    assert gate.reference_file(real_model) == committed
    tokens = real_model.encode_text(gate.shipped_text("prose"))
    decoded = decompress(real_model, committed)
    assert decoded.tokens == tokens and not decoded.kv_exact

"""A worse model where the coder builds its tables, with the model identity and the header
unchanged, fails every run's bounds, through the API and the CLI, and nothing is written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

import seqkv.levels.base
import seqkv.levels.portable
from seqkv import cli, compress
from seqkv.bench.texts import shipped_text
from seqkv.bounds import BoundViolationError
from seqkv.coding.frequencies import cumulative_from_logits, log_softmax_bits, uniform_distribution
from seqkv.models import CausalLM

pytestmark = pytest.mark.real_model

Tables = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]


def _sharpened(logits: npt.NDArray[np.floating]) -> Tables:
    sharp = np.asarray(logits, dtype=np.float64) * 50.0
    return cumulative_from_logits(sharp), log_softmax_bits(sharp)


def _uniform(logits: npt.NDArray[np.floating]) -> Tables:
    return uniform_distribution(int(np.asarray(logits).shape[-1]))


DEGRADED: dict[str, Callable[[npt.NDArray[np.floating]], Tables]] = {
    "sharpened-50x": _sharpened, "uniform": _uniform}


@pytest.fixture(params=sorted(DEGRADED))
def degraded(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every model-coded level builds its tables through this one function."""
    monkeypatch.setattr(seqkv.levels.base, "model_distribution", DEGRADED[request.param])
    return str(request.param)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("degraded") / "in.txt"
    path.write_text(shipped_text("prose")[:220])
    return path


@pytest.mark.parametrize("level", ["tokens", "rows"])
def test_the_api_raises_with_the_bounds(real_model: CausalLM, degraded: str, text: Path,
                                        level: str) -> None:
    tokens = real_model.encode_text(text.read_text())
    with pytest.raises(BoundViolationError, match="code_within_reference_cross_entropy") as error:
        compress(real_model, tokens, level=level)
    by_name = {b.name: b for b in error.value.bounds}
    assert by_name["code_within_table_cost"].holds  # the coder's own accounting cannot see it
    assert not by_name["code_within_reference_cross_entropy"].holds


def test_the_cli_compress_exits_2_with_one_line_and_writes_nothing(
    real_model: CausalLM, degraded: str, text: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cli.common, "load", lambda path: real_model)
    output = tmp_path / "out.skv"
    output.write_bytes(b"an existing file")
    status = cli.main(["compress", str(text), "-o", str(output), "--json", "--level", "rows"])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "code_within_reference_cross_entropy" in lines[0]
    assert output.read_bytes() == b"an existing file"


def test_a_uniform_integer_predictor_fails_the_default_level(
    real_model: CausalLM, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The portable level (the default) builds its tables from the integer predictor's logits:
    with every logit zeroed (the uniform distribution) it fails its reference bound, through the
    API and through the CLI's default level, and nothing is written."""
    tables, table = seqkv.levels.portable.integer_tables, seqkv.levels.portable.integer_table
    monkeypatch.setattr(seqkv.levels.portable, "integer_tables",
                        lambda rows, out=None: tables(np.zeros_like(rows), out))
    monkeypatch.setattr(seqkv.levels.portable, "integer_table",
                        lambda row: table(np.zeros_like(row)))
    tokens = real_model.encode_text(text.read_text())
    with pytest.raises(BoundViolationError, match="code_within_reference_cross_entropy"):
        compress(real_model, tokens)
    monkeypatch.setattr(cli.common, "load", lambda path: real_model)
    output = tmp_path / "out.skv"
    status = cli.main(["compress", str(text), "-o", str(output)])
    captured = capsys.readouterr()
    assert status == 2 and "code_within_reference_cross_entropy" in captured.err
    assert not output.exists()


def test_the_cli_check_exits_1_naming_the_bounds(
    real_model: CausalLM, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(seqkv.levels.base, "model_distribution", _sharpened)
    monkeypatch.setattr(cli.common, "load", lambda path: real_model)
    status = cli.main(["check", str(text), "--report", str(tmp_path / "r.md"), "--json",
                       "--level", "rows", "--entropy-contexts", "2"])
    report = json.loads(capsys.readouterr().out)
    failed = {c["name"] for c in report["checks"] if c["kind"] == "bound" and not c["holds"]}
    assert status == 1 and report["passed"] is False
    assert failed == {"code_within_reference_cross_entropy"}

"""Issue 17's list of CLI misuses: each ends in one line ``seqkv: error: ...``, exit status 2,
no traceback, and no output changed (no input ever overwritten)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from seqkv import cli, files
from seqkv.models import CausalLM

TEXT = "Keeping the light was hard and lonely work.\n"


def _expect_error(capsys: pytest.CaptureFixture[str], words: str, *argv: str) -> None:
    status = cli.main(list(argv))
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith("seqkv: error:") and words in err.lower(), err
    assert "Traceback" not in err and err.count("\n") == 1, err


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text(TEXT)
    return path


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf", "x", "-0", "1e-320"])
def test_a_tolerance_that_is_negative_or_not_finite_is_refused_at_parse_time(
        text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    _expect_error(capsys, "tolerance", "compress", str(text), "-o", str(tmp_path / "x.skv"),
                  f"--tolerance={value}")
    assert not (tmp_path / "x.skv").exists()


def test_an_output_below_a_file_is_refused(text: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    _expect_error(capsys, "not a folder", "compress", str(text), "-o",
                  str(text.parent / "in.txt" / "x.skv"))


def test_an_output_in_a_missing_folder_is_refused(text: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(capsys, "does not exist", "compress", str(text), "-o",
                  str(tmp_path / "missing" / "x.skv"))


def test_the_input_is_never_the_output(text: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(capsys, "input", "compress", str(text), "-o", str(text))
    assert text.read_text() == TEXT


def test_a_usage_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(capsys, "", "compress")
    _expect_error(capsys, "", "frobnicate")


def test_a_segment_count_out_of_range_is_refused(text: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(capsys, "segment", "compress", str(text), "-o", str(tmp_path / "x.skv"),
                  "--level", "segments:100000")


def test_a_name_too_long_is_refused(text: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(capsys, "", "compress", str(text), "-o", str(tmp_path / ("x" * 300 + ".skv")))


@pytest.mark.real_model
def test_decompress_with_a_bad_kv_output_changes_no_output(
        real_model: CausalLM, monkeypatch: pytest.MonkeyPatch, text: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli.common, "load", lambda path: real_model)
    skv, out = tmp_path / "s.skv", tmp_path / "out.txt"
    assert cli.main(["compress", str(text), "-o", str(skv), "--no-verify"]) == 0
    out.write_text("keep me")
    capsys.readouterr()
    _expect_error(capsys, "does not exist", "decompress", str(skv), "-o", str(out), "--kv-out",
                  str(tmp_path / "missing" / "kv.safetensors"))
    assert out.read_text() == "keep me"


@pytest.mark.real_model
def test_a_full_disk_is_one_line_and_changes_nothing(
        real_model: CausalLM, monkeypatch: pytest.MonkeyPatch, text: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli.common, "load", lambda path: real_model)
    skv = tmp_path / "s.skv"
    skv.write_bytes(b"old")

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    _expect_error(capsys, "no space left", "compress", str(text), "-o", str(skv), "--no-verify")
    assert skv.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "s.skv"]


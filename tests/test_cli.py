"""The ``seqkv`` command on the embedded model: JSON figures, round trip, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from seqkv import cli
from seqkv.models import CausalLM

pytestmark = pytest.mark.real_model

TEXT = "Keeping the light was hard and lonely work. The lamp had to be cleaned every morning.\n"


@pytest.fixture
def use_model(real_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> CausalLM:
    monkeypatch.setattr(cli.common, "load", lambda path: real_model)
    return real_model


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_compress_decompress_inspect(
    use_model: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, skv, back, kv = (tmp_path / n for n in ("in.txt", "s.skv", "out.txt", "kv.st"))
    source.write_text(TEXT)
    status, out, _ = _run(capsys, "compress", str(source), "-o", str(skv), "--json")
    assert status == 0
    figures = json.loads(out)
    for key in ("tokens", "code_bits", "bits_per_token", "cross_entropy_bits_per_token",
                "kv_components_per_token", "fp16_bits_per_token", "ratio_vs_fp16",
                "encode_seconds", "verified"):
        assert key in figures
    assert figures["verified"] is True
    assert figures["kv_components_per_token"] == 11_520
    assert figures["fp16_bits_per_token"] == 184_320

    status, out, _ = _run(capsys, "decompress", str(skv), "-o", str(back), "--kv-out", str(kv),
                          "--json")
    assert status == 0
    decoded = json.loads(out)
    assert decoded["verified"] is True and decoded["tokens"] == figures["tokens"]
    assert decoded["tolerance"] == 1e-4 and decoded["max_abs_residual"] >= 0.0
    assert decoded["tokens_verified"] is True and decoded["kv_verified"] is True
    assert "decode_seconds" in decoded
    assert back.read_text() == TEXT
    tensors = load_file(kv)
    assert tensors["keys"].shape == (30, 3, figures["tokens"], 64)

    status, out, _ = _run(capsys, "inspect", str(skv), "--json")
    assert status == 0
    header = json.loads(out)
    assert header["tokens"] == figures["tokens"]
    assert header["level"] == "portable"  # the default level (issue 26)
    assert header["profile"]["schedule"] == "prefill"  # portable's KV is one full prefill


def _expect_error(capsys: pytest.CaptureFixture[str], words: str, *argv: str) -> None:
    status, _, err = _run(capsys, *argv)
    assert status == 2
    assert err.startswith("seqkv: error:") and words in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_empty_text_is_a_clear_error(
    use_model: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty.txt").write_text("")
    _expect_error(capsys, "empty", "compress", str(tmp_path / "empty.txt"), "-o",
                  str(tmp_path / "x.skv"))
    assert not (tmp_path / "x.skv").exists()


def test_missing_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _expect_error(capsys, "no such file", "inspect", str(tmp_path / "nope.skv"))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda d: d[: len(d) // 2], "truncated"),
        (lambda d: d[:-5] + bytes([d[-5] ^ 1]) + d[-4:], "corrupted"),
        (lambda d: d[:4] + bytes([7]) + d[5:], "version 7"),
        (lambda d: b"not an skv file at all", "magic"),
        (lambda d: b"", "empty"),
    ],
)
def test_damaged_files_are_clear_errors(
    use_model: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    damage: object, words: str,
) -> None:
    source, skv = tmp_path / "in.txt", tmp_path / "s.skv"
    source.write_text("A short text.")
    assert cli.main(["compress", str(source), "-o", str(skv), "--no-verify"]) == 0
    capsys.readouterr()
    skv.write_bytes(damage(skv.read_bytes()))  # type: ignore[operator]
    out = tmp_path / "out.txt"
    _expect_error(capsys, words, "decompress", str(skv), "-o", str(out))
    assert not out.exists()


def test_check_passes_with_exact_theorem1_and_lemma1_rows(
    use_model: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    source, report = tmp_path / "in.txt", tmp_path / "report.md"
    source.write_text(TEXT)
    status, out, _ = _run(capsys, "check", str(source), "--report", str(report), "--json",
                          "--entropy-contexts", "2")
    figures = json.loads(out)
    assert status == 0 and figures["passed"] is True and figures["level"] == "portable"
    for check in figures["checks"]:
        assert {"name", "bound", "measured", "holds", "interval"} <= set(check)
    theorem1 = figures["theorem1"]
    assert theorem1["exact"] is True and theorem1["positions"] == figures["tokens"]
    assert theorem1["collision_classes"]  # SmolLM2-135M: 15 ids in 4 classes
    names = {c["name"]: c for c in figures["checks"]}
    assert names["theorem1_exact_gap"]["kind"] == "figure"
    assert names["lemma1_integer_batch_of_2"]["kind"] == "bound"
    assert names["lemma1_integer_batch_of_2"]["holds"] is True
    assert names["lemma1_float_digest_restored"]["holds"] is True
    assert "**Verdict: PASS**" in report.read_text()


@pytest.mark.parametrize("level", ["segments:3", "plain"])
def test_compress_at_a_level_and_decode_tokens_only(
    use_model: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str], level: str
) -> None:
    source, skv, back, ids = (tmp_path / n for n in ("in.txt", "s.skv", "out.txt", "ids.json"))
    source.write_text(TEXT)
    status, out, _ = _run(capsys, "compress", str(source), "-o", str(skv), "--level", level,
                          "--json")
    assert status == 0 and json.loads(out)["level"] == level
    status, _, _ = _run(capsys, "decompress", str(skv), "-o", str(back))
    assert status == 0 and back.read_text() == TEXT
    status, _, _ = _run(capsys, "decompress", str(skv), "-o", str(ids), "--tokens-only")
    assert status == 0
    assert json.loads(ids.read_text()) == use_model.encode_text(TEXT)


def test_unknown_level_is_a_usage_error(
    use_model: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.txt"
    source.write_text(TEXT)
    status = cli.main(["compress", str(source), "-o", str(tmp_path / "s.skv"), "--level", "fast"])
    err = capsys.readouterr().err
    assert status == 2 and "unknown level 'fast'" in err and err.count("\n") == 1

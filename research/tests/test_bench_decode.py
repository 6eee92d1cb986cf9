"""``python -m research.bench decode`` plumbing on the tiny model: fields, exactness, the Pareto
table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from research.bench import decode as bench
from research.bench.cli import main
from seqkv.models import CausalLM


def test_decode_bench_reports_every_level_exact(tiny_model: CausalLM,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def byte_tokens(model: CausalLM, kind: str, count: int) -> list[int]:
        return [b % model.vocab_size for b in kind.encode() * 40][:count]

    monkeypatch.setattr(bench, "kind_tokens", byte_tokens)
    levels = ("tokens", "rows", "segments:3", "ngram", "plain", "portable")
    texts = {kind: byte_tokens(tiny_model, kind, 30) for kind in bench.TEXT_FILES}
    result = bench.run_decode_bench(tiny_model, tokens_per_text=30, sessions=4, levels=levels,
                                    more_sessions=(5,), texts=texts)
    figures = json.loads(json.dumps(result.to_json_dict()))
    for key in ("prefill_tokens_per_second", "token_by_token_tokens_per_second",
                "batched_sessions", "batched_tokens_per_second", "levels"):
        assert key in figures
    assert figures["batched_sessions"] == 4 and figures["batched_exact"] is True
    assert [level["name"] for level in figures["levels"]] == list(levels)
    assert all(level["exact"] for level in figures["levels"])
    for level in figures["levels"]:
        assert set(level) >= {"name", "exact", "bits_per_token", "decode_tokens_per_second"}
    plain = next(level for level in figures["levels"] if level["name"] == "plain")["bits_per_token"]
    assert plain == pytest.approx(np.log2(tiny_model.vocab_size), abs=0.2)
    assert len(figures["texts"]) == len(bench.TEXT_FILES)
    table = bench.render_markdown(result, "python -m research.bench decode")
    assert "| segments:3 | yes |" in table and "Batched: 4 sessions" in table
    assert [c["segments"] for c in figures["segment_costs"]] == [2, 4, 8, 16, 32]
    assert "extra bits per added segment" in table
    # the portable level's sessions batch too, exactly, and the table says so
    assert [(b["level"], b["sessions"], b["exact"]) for b in figures["batched_by_level"]] == [
        ("portable", 4, True)]
    assert "The same 4 sessions at the portable level decoded together" in table
    # only the portable level encodes the tokens alone, and the table gives both encode speeds
    without_kv = {level["name"]: level["encode_tokens_per_second_without_kv"]
                  for level in figures["levels"]}
    assert without_kv.pop("portable") > 0 and set(without_kv.values()) == {None}
    assert "Encode at portable against one prefill" in table


def test_a_text_shorter_than_the_token_count_is_refused_by_name(
        use_tiny: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bench used to measure a shorter text whole under the count it reported."""
    short = tmp_path / "short.txt"
    short.write_text("only five words in here")
    report = tmp_path / "r.md"
    status = main(["decode", "--tokens", "10", "--texts", str(short), "--sessions",
                       "0", "--levels", "plain", "--report", str(report)])
    err = capsys.readouterr().err
    assert status != 0 and "the short text has 5 tokens, fewer than --tokens 10" in err, err
    assert not report.exists()


def test_given_texts_and_levels_without_a_batched_run(
        use_tiny: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "long.txt"
    text.write_text(" ".join(f"word{i}" for i in range(40)))
    report = tmp_path / "r.md"
    assert main(["decode", "--tokens", "24", "--texts", str(text), "--sessions",
                     "0", "--levels", "plain", "ngram", "--report", str(report), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert [t["kind"] for t in figures["texts"]] == ["long"]
    assert figures["texts"][0]["tokens"] == 24
    assert [level["name"] for level in figures["levels"]] == ["plain", "ngram"]
    assert figures["batched_sessions"] == 0 and figures["batched_tokens_per_second"] is None
    table = report.read_text()
    assert f"texts: {text}, first 24 tokens each" in table
    assert "Batched: not run (`--sessions 0`)." in table
    assert f"--texts {text} --levels plain ngram" in table


def test_given_texts_with_a_batched_run_are_refused(
        use_tiny: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The batched run cuts its sessions from the shipped texts: with --texts it would report
    other tokens than the texts named."""
    text = tmp_path / "long.txt"
    text.write_text(" ".join(f"word{i}" for i in range(40)))
    status = main(["decode", "--tokens", "24", "--texts", str(text), "--sessions",
                       "4", "--report", str(tmp_path / "r.md")])
    assert status != 0 and "pass --sessions 0 with --texts" in capsys.readouterr().err

"""The mix bench: a held-out workload, and a quick run on the tiny model with byte tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import research.bench.mix
from research.bench.cli import main
from research.bench.mix import (
    DEFAULT_VARIANTS,
    UNIQUE_PASSAGES,
    passages,
    quoted_tokens,
    rag_workload,
    render_markdown,
    run_mix_bench,
)
from seqkv import cli
from seqkv.mixing.dictionary import build_dictionary
from seqkv.models import CausalLM


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_measured_sessions_are_held_out_and_unique_text_is_unseen() -> None:
    workload = rag_workload()
    sample = [s.text for s in workload.dictionary_sessions]
    assert not {s.text for s in workload.measured_sessions} & set(sample)
    unique = [p for p in passages() if (p.kind, p.index) in UNIQUE_PASSAGES]
    assert len(unique) == len(UNIQUE_PASSAGES)
    for passage in unique:
        assert not any(passage.text in text for text in sample)
    assert workload == rag_workload()
    orders = {s.documents for s in workload.dictionary_sessions}
    assert len(orders) > len(workload.dictionary_sessions) // 2  # documents vary in order


def test_quoted_tokens_counts_tokens_inside_long_dictionary_runs() -> None:
    dictionary = build_dictionary([list(range(100))], 512)
    tokens = [500] * 10 + list(range(20, 40)) + [501] * 10 + list(range(50, 60))
    assert quoted_tokens(dictionary, tokens, span=16) == 20


def test_a_quick_run_on_the_tiny_model(tiny_model: CausalLM) -> None:
    bench = run_mix_bench(tiny_model, dictionary_sessions=6, template_sessions=1,
                          variants=DEFAULT_VARIANTS[:2], texts=("code",), encode=_bytes,
                          max_tokens=300)
    names = [s.name for s in bench.sessions if s.base == "model"]
    assert names == ["rag-0", "rag-1", "rag-2", "rag-3", "rag-template-0", "unique-only"]
    assert len(bench.sessions) == 2 * len(names)
    unique_only = [s for s in bench.sessions if s.name == "unique-only"]
    assert all(s.quoted_fraction == 0.0 and s.within_guarantee for s in unique_only)
    assert all(s.quoted_fraction > 0.2 for s in bench.sessions if s.name.startswith("rag"))
    assert all(s.within_guarantee for s in bench.sessions)
    assert all(t.within_guarantee for t in bench.texts)
    assert bench.quoting_mixed_bits_per_token < bench.quoting_model_bits_per_token
    assert bench.dictionary.tokens <= bench.dictionary.sample_tokens
    assert [v.name for v in bench.variants] == ["default", "with-apm"]
    json.dumps(bench.to_json_dict())
    report = render_markdown(bench, "python -m research.bench mix")
    assert f"| code | {bench.texts[0].tokens} |" in report
    assert f"{bench.quoting_mixed_bits_per_token:.3f}" in report


def test_the_cli_writes_the_report_and_prints_json(
        tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    bench = run_mix_bench(tiny_model, dictionary_sessions=4, template_sessions=1,
                          variants=DEFAULT_VARIANTS[:1], texts=("code",), encode=_bytes,
                          max_tokens=120)
    monkeypatch.setattr(cli.common, "load", lambda path: tiny_model)
    monkeypatch.setattr(research.bench.mix, "run_mix_bench", lambda *args, **kwargs: bench)
    report = tmp_path / "reports" / "mixing.md"
    assert main(["mix", "--report", str(report), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["report"] == str(report)
    assert printed["mixed_bits_per_token"] == bench.mixed_bits_per_token
    assert report.read_text().startswith("# Mixing")

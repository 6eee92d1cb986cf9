"""The committed long texts (``benchmarks/texts/long/``) and the long-check report's parts."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from benchmark_scripts import load_benchmark
from seqkv.models.adapter import CausalLM
from seqkv.provenance import start_run

LONG = Path(__file__).resolve().parents[1] / "benchmarks" / "texts" / "long"
KINDS = ("prose", "code", "legal", "technical")


def test_every_long_text_is_named_in_licenses_with_its_sha256() -> None:
    licenses = (LONG / "LICENSES.md").read_text(encoding="utf-8")
    named = dict(re.findall(r"- `(\w+\.txt)`: `([0-9a-f]{64})`", licenses))
    assert sorted(named) == sorted(p.name for p in LONG.glob("*.txt"))
    assert sorted(named) == sorted(f"{kind}.txt" for kind in KINDS)
    for name, digest in named.items():
        assert hashlib.sha256((LONG / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.real_model
@pytest.mark.parametrize("kind", KINDS)
def test_long_text_reaches_the_models_context(real_model: CausalLM, kind: str) -> None:
    text = (LONG / f"{kind}.txt").read_text(encoding="utf-8")
    assert len(real_model.encode_text(text)) >= 8192


def test_cut_keeps_whole_lines_within_the_limit() -> None:
    long_checks = load_benchmark("long_checks")
    text = "a b\nc d e\nf\ng h i j\n"

    def words(piece: str) -> int:
        return len(piece.split())

    assert long_checks.cut_at_line_break(text, 5, words) == "a b\nc d e\n"
    assert long_checks.cut_at_line_break(text, 6, words) == "a b\nc d e\nf\n"
    assert long_checks.cut_at_line_break(text, 100, words) == text


def test_report_shows_a_failed_check_as_a_row_not_an_exception() -> None:
    long_checks = load_benchmark("long_checks")
    run = long_checks.Run(exit_code=1, wall_seconds=12.0, cpu_seconds=20.0, max_rss_mib=900.0,
                          load_before=6.0, load_after=7.0)
    passed = {"passed": True, "code_bits": 8000.0, "cross_entropy_bits": 7990.0,
              "checks": [{"name": "code_within_table_cost", "kind": "bound", "holds": True}],
              "theorem1": {"positions": 1999, "gap_bits": 1e-6, "mean_gap_bits": 5e-10,
                           "max_gap_bits": 1e-7},
              "lemma1": {"integer": [{"identical": True}], "digest_restored": True},
              "phases": [{"name": "compress", "cpu_seconds": 10.0, "wall_seconds": 5.0}]}
    done = long_checks.Run(0, 12.0, 20.0, 900.0, 6.0, 7.0)
    rows = [long_checks.Row("prose", "p.txt", "0" * 64, 2000, run, None),
            long_checks.Row("code", "c.txt", "1" * 64, 2000, done, passed)]
    header = start_run("SmolLM2-135M-Instruct", "long texts", "python benchmarks/long_checks.py")
    report = long_checks.render(header.finished(),
                                {2000: (["python benchmarks/long_checks.py"], rows)})
    assert report.startswith("# `seqkv check` on long texts of each kind\n\n- command: ")
    assert "| prose | p.txt | 2,000 | FAIL (exit 1, no JSON) |" in report
    assert "| code | c.txt | 2,000 | PASS (exit 0) | 1 of 1 | 1,999 positions" in report
    assert "| compress | 10.0 (5.0) |" in report
    assert "900" in report and "6.0 / 7.0" in report

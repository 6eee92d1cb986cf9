"""``seqkv bench`` commands that need no model."""

from __future__ import annotations

import json

import pytest

from seqkv import cli


def test_bench_trie_json_has_the_promised_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "trie", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    for key in ("sessions", "tokens", "bytes_naive", "bytes_trie", "bytes_hashed_blocks",
                "hit_rate", "hit_rate_hashed_blocks", "storage_predicted", "storage_measured",
                "insert_tokens_per_second", "match_tokens_per_second"):
        assert key in figures
    assert figures["bytes_trie"] < figures["bytes_naive"]
    assert 0 < figures["hit_rate"] <= 1


def test_bench_quant_without_sweep_reports_turboquant_mse(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["bench", "quant", "--no-sweep", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    table = figures["turboquant_mse"]
    assert set(table) == {"64", "128"} and set(table["64"]) == {"1", "2", "3", "4"}
    # Within 5% of the Lloyd-Max optimum for the exact law of a rotated coordinate.
    for bits, optimum in zip("1234", (0.3584, 0.1145, 0.0334, 0.0091), strict=True):
        assert abs(table["64"][bits] / optimum - 1) < 0.05

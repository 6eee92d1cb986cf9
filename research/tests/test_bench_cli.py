"""``python -m research.bench`` verbs that need no model, and the gates that stay in ``seqkv``."""

from __future__ import annotations

import json

import pytest

from research.bench.cli import main
from seqkv import cli


def test_bench_trie_json_has_the_promised_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trie", "--json"]) == 0
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
    assert main(["quant", "--no-sweep", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    table = figures["turboquant_mse"]
    assert set(table) == {"64", "128"} and set(table["64"]) == {"1", "2", "3", "4"}
    # Within 5% of the Lloyd-Max optimum for the exact law of a rotated coordinate.
    for bits, optimum in zip("1234", (0.3584, 0.1145, 0.0334, 0.0091), strict=True):
        assert abs(table["64"][bits] / optimum - 1) < 0.05


@pytest.mark.parametrize("verb", ["decode", "mix", "store", "trie", "quant"])
def test_the_package_keeps_only_the_gates(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The measurements left ``seqkv bench``; the gates did not."""
    assert cli.main(["bench", verb, "--help"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    for gate in ("figures", "timing"):
        assert cli.main(["bench", gate, "--help"]) == 0


def test_a_bad_argument_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["store", "--parts", "model,disks"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqkv: error: argument --parts: unknown part 'disks'")
    assert err.endswith("(python -m research.bench store --help)\n") and err.count("\n") == 1

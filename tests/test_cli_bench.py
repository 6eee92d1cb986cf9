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

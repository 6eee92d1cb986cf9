"""``research.bench.layer1``: the store's token-granular matches against whole hashed blocks, on
a small generated workload (invariants 1 and 2 of the module)."""

from __future__ import annotations

from pathlib import Path

import pytest

import research.bench.layer1 as layer1
from research.bench.trie import WorkloadSpec

SPEC = WorkloadSpec(sessions=12, system_prompts=2, system_prompt_tokens=(20, 40),
                    few_shot_tokens=(5, 20), documents=3, document_tokens=(20, 60),
                    tail_tokens=(3, 9))


def _run(tmp_path: Path, name: str) -> list[layer1.Layer1Row]:
    return layer1.run_layer1(SPEC, 3, 6, tmp_path / name, "test")


def test_the_blocks_find_whole_blocks_only_and_runs_repeat(tmp_path: Path) -> None:
    rows = _run(tmp_path, "a.md")
    assert rows == _run(tmp_path, "b.md")
    trie, blocks = rows[-2:]
    assert (trie.provider, blocks.provider) == ("trie", "blocks")
    assert blocks.shared_tokens % SPEC.block_size == 0
    assert blocks.shared_tokens < trie.shared_tokens
    assert (tmp_path / "a.md").read_text().count("\n| trie |") == 2


def test_the_block_test_catches_a_provider_that_is_not_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layer1, "_block_granular", lambda store, block: None)
    trie, blocks = _run(tmp_path, "a.md")[-2:]
    assert blocks.shared_tokens == trie.shared_tokens
    assert blocks.shared_tokens % SPEC.block_size != 0

"""The README's Python blocks run as written, in order, in one namespace: all of them on the tiny
model, and the first (compress and restore a session) on the embedded model, as a user runs it.

``load_default_model`` is replaced by the test's model; on the tiny model a whitespace tokenizer
stands in for the real one (the ``use_tiny`` fixture). The blocks' own ``assert`` statements
(tokens restored and verified, a store session read back) are the checks, with a few more here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import seqkv.models
from seqkv.models import CausalLM

README = Path(__file__).parent.parent / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def run_blocks(blocks: list[str]) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "readme"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{README} python block {number}", "exec"), namespace)
    return namespace


def test_python_blocks_run_on_the_tiny_model(
    use_tiny: CausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(seqkv.models, "load_default_model", lambda: use_tiny)
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 3  # compress/decompress, the store, the HF cache helpers
    namespace = run_blocks(blocks)
    assert (tmp_path / "session.skv").is_file() and (tmp_path / "cache.seqkv").is_file()
    assert namespace["decoded"].tokens == namespace["tokens"]  # type: ignore[attr-defined]


# NOTE: the first block only: the store and cache blocks run the same calls as on the tiny model,
# and on SmolLM2 each adds integer forwards to a test that the suite runs on every commit.
@pytest.mark.real_model
def test_first_python_block_runs_on_the_embedded_model(
    real_model: CausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(seqkv.models, "load_default_model", lambda: real_model)
    namespace = run_blocks(python_blocks(README.read_text(encoding="utf-8"))[:1])
    assert (tmp_path / "session.skv").is_file()
    assert namespace["decoded"].tokens == namespace["tokens"]  # type: ignore[attr-defined]


def test_a_broken_block_fails(
    use_tiny: CausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutant: the restore compared with other tokens; the block's own assert must catch it.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(seqkv.models, "load_default_model", lambda: use_tiny)
    block = python_blocks(README.read_text(encoding="utf-8"))[0]
    mutant = block.replace("assert decoded.tokens == tokens", "assert decoded.tokens == tokens[1:]")
    assert mutant != block
    with pytest.raises(AssertionError):
        run_blocks([mutant])

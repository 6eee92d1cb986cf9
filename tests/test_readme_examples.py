"""The README's Python blocks run, in order, in one namespace, on the tiny model.

``load_default_model`` is replaced by the session's tiny Llama behind a whitespace tokenizer
(the ``use_tiny`` fixture), so the blocks exercise the same calls as on SmolLM2 in a second;
their own ``assert`` statements (tokens restored, verified) are the checks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from seqkv.models import CausalLM

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def run_blocks(blocks: list[str]) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "readme"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"README.md python block {number}", "exec"), namespace)
    return namespace


@pytest.fixture
def readme_model(use_tiny: CausalLM, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CausalLM:
    import seqkv.models

    monkeypatch.setattr(seqkv.models, "load_default_model", lambda: use_tiny)
    monkeypatch.chdir(tmp_path)
    return use_tiny


def test_the_readme_python_blocks_run(readme_model: CausalLM) -> None:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 3  # compress/decompress, the store, the HF cache helpers
    namespace = run_blocks(blocks)
    assert namespace["decoded"].tokens == namespace["tokens"]  # type: ignore[attr-defined]
    assert Path("session.skv").is_file() and Path("cache.seqkv").is_file()


def test_a_broken_block_fails(readme_model: CausalLM) -> None:
    # Mutant: the restore compared with other tokens; the block's own assert must catch it.
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    mutant = blocks[0].replace("assert decoded.tokens == tokens",
                               "assert decoded.tokens == tokens[1:]")
    assert mutant != blocks[0]
    with pytest.raises(AssertionError):
        run_blocks([mutant])

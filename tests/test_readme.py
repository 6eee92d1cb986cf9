"""The README's Python example runs as written (on the embedded model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import seqkv.models
from seqkv.models import CausalLM

pytestmark = pytest.mark.real_model

README = Path(__file__).parent.parent / "README.md"


def test_python_example_runs(
    real_model: CausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert example is not None
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(seqkv.models, "load_default_model", lambda: real_model)
    namespace: dict[str, object] = {}
    exec(compile(example.group(1), str(README), "exec"), namespace)
    assert (tmp_path / "session.skv").is_file()
    assert namespace["decoded"].tokens == namespace["tokens"]  # type: ignore[attr-defined]

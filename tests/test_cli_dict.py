"""``seqkv dict build`` and ``--dict`` on compress and decompress, with the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqkv import cli
from seqkv.models import CausalLM


@pytest.fixture
def use_tiny(tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> CausalLM:
    """The tiny model with a whitespace tokenizer (word -> id) that it lacks."""
    words: dict[str, int] = {}

    def encode(text: str) -> list[int]:
        return [words.setdefault(word, 3 + len(words) % 500) for word in text.split()]

    def decode(tokens: list[int]) -> str:
        names = {v: k for k, v in words.items()}
        return " ".join(names[t] for t in tokens)

    monkeypatch.setattr(cli.common, "load", lambda path: tiny_model)
    monkeypatch.setattr(tiny_model, "encode_text", encode)
    monkeypatch.setattr(tiny_model, "decode_tokens", decode)
    return tiny_model


def test_a_dictionary_codes_quoted_content_in_fewer_bits(
        use_tiny: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = " ".join(f"clause{i} of the agreement binds party{i % 7}" for i in range(40))
    sample = tmp_path / "sample.txt"
    sample.write_text(document)
    session = tmp_path / "session.txt"
    session.write_text("please summarise " + " ".join(document.split()[40:200]) + " thanks")
    dictionary = tmp_path / "legal.dict"
    assert cli.main(["dict", "build", str(sample), "-o", str(dictionary), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    sizes = {}
    for level, extra in (("portable", []), ("portable+mix", ["--dict", str(dictionary)])):
        out = tmp_path / f"{level}.skv"
        assert cli.main(["compress", str(session), "-o", str(out), "--level", level,
                         "--kv", "none", "--json", *extra]) == 0
        sizes[level] = json.loads(capsys.readouterr().out)["code_bits"]
    assert sizes["portable+mix"] < sizes["portable"] / 2
    back = tmp_path / "back.txt"
    mixed = str(tmp_path / "portable+mix.skv")
    assert cli.main(["decompress", mixed, "-o", str(back), "--dict", str(dictionary)]) == 0
    assert back.read_text() == session.read_text()
    assert cli.main(["decompress", mixed, "-o", str(back)]) == 2
    assert built["digest"][:16] in capsys.readouterr().err

"""One line, one error: API inputs that used to escape as plain Python exceptions, and the CLI's
model loading, which printed the loaders' progress bars before its one error line."""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from seqkv import cli
from seqkv.cli import common
from seqkv.coding.residual import check_tolerance
from seqkv.errors import (
    InvalidLevelError,
    InvalidNameError,
    InvalidToleranceError,
    ModelLoadError,
    SeqKVError,
)
from seqkv.levels import parse_level
from seqkv.mixing.dictionary import Dictionary
from seqkv.models import CausalLM
from seqkv.trie.keys import Namespace, prefix_hash

LEGACY = Path(__file__).parent / "data" / "legacy"


@pytest.mark.parametrize("text", ["segments:²", "segments:٣", "segments:0", "portable:99999"])
def test_a_level_whose_count_is_not_an_ascii_number_in_range(text: str) -> None:
    with pytest.raises(InvalidLevelError):
        parse_level(text)


@pytest.mark.parametrize("value", [-0.0, 1e-320, 5e-324, -1e-4, float("nan")])
def test_a_tolerance_is_a_positive_normal_number_or_exactly_zero(value: float) -> None:
    with pytest.raises(InvalidToleranceError):
        check_tolerance(value)
    assert check_tolerance(0.0) == 0.0 and check_tolerance(sys.float_info.min) > 0


def test_a_namespace_with_a_lone_surrogate() -> None:
    with pytest.raises(InvalidNameError, match="surrogate"):
        prefix_hash(Namespace("ns\udcff"), [1, 2])
    with pytest.raises(SeqKVError, match="surrogate"):
        Dictionary(np.array([1, 2, 3]), [3], 512, "ns\udcff")


def test_a_legacy_first_token_context_at_the_vocabulary_size(tiny_model: CausalLM) -> None:
    """Before its range check, a context equal to the vocabulary indexed past the model's
    embedding (IndexError); it is a malformed header, or another model's start token."""
    from seqkv.skv import decompress

    data = (LEGACY / "v2-tokens.skv").read_bytes()
    layout = struct.Struct("<8sHHIQQQ")
    magic, version, reserved, length, *sizes = layout.unpack_from(data)
    header = json.loads(data[layout.size : layout.size + length])
    header["tokens"]["first_token_context"] = tiny_model.vocab_size
    raw = json.dumps(header).encode()
    body = layout.pack(magic, version, reserved, len(raw), *sizes) + raw + data[
        layout.size + length : -32]
    with pytest.raises(SeqKVError):
        decompress(tiny_model, body + hashlib.sha256(body).digest())


def test_model_loading_is_quiet_unless_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A loader that prints bars and warnings before failing: the CLI shows only its error line,
    and the bars with --progress."""
    def noisy(path: str | None) -> CausalLM:
        print("Converting and de-quantizing GGUF tensors...: 100%", file=sys.stderr)
        warnings.warn("a library warning", UserWarning, stacklevel=1)
        raise ModelLoadError("cannot load the GGUF model x.gguf: broken")

    monkeypatch.setattr(common, "load", noisy)
    text = tmp_path / "in.txt"
    text.write_text("hello there\n")
    out = str(tmp_path / "x.skv")
    assert cli.main(["compress", str(text), "-o", out]) != 0
    err = capsys.readouterr().err
    assert err.startswith("seqkv: error:") and err.count("\n") == 1, err
    cli.main(["compress", str(text), "-o", out, "--progress"])
    assert "Converting" in capsys.readouterr().err


def test_store_ls_with_a_port_that_is_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    for location in ("redis://127.0.0.1:notaport/0", "redis://127.0.0.1:6379/x"):
        assert cli.main(["store", "ls", "--store", location]) == 2
        err = capsys.readouterr().err
        assert err.startswith("seqkv: error:") and err.count("\n") == 1, err

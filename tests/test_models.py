"""Loading models from local paths, and their identities."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqkv import compress, decompress
from seqkv.errors import InvalidTokensError, ModelLoadError
from seqkv.models import CausalLM, load_model, tiny_random_llama


def test_a_saved_hf_folder_loads_with_the_same_identity(
    tiny_model: CausalLM, tmp_path: Path
) -> None:
    tiny_model.model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.identity.same_model(tiny_model.identity)
    data = compress(tiny_model, [3, 1, 4, 1, 5]).data
    assert decompress(loaded, data).tokens == [3, 1, 4, 1, 5]


def test_a_model_without_tokenizer_refuses_text_clearly(tiny_model: CausalLM) -> None:
    with pytest.raises(InvalidTokensError, match="no tokenizer"):
        tiny_model.encode_text("hello")


def test_identity_depends_on_the_weights() -> None:
    assert not tiny_random_llama(seed=0).identity.same_model(tiny_random_llama(seed=1).identity)
    assert tiny_random_llama(seed=0).identity == tiny_random_llama(seed=0).identity


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_model(tmp_path)

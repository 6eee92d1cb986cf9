"""save_cache / load_cache: a DynamicCache persisted and restored bit for bit, in three dtypes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from seqkv.errors import InvalidKVError, NotASeqKVFileError
from seqkv.kvcache import tensor_from_cache
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.store.hf import load_cache, save_cache

PROMPT = [1, 17, 230, 5, 99, 410, 3, 77, 301, 12, 12, 64, 128, 256, 7, 33]


def _continue(model: torch.nn.Module, cache: DynamicCache, prompt: list[int]) -> list[int]:
    ids = torch.tensor([[*prompt, 42]])  # [1, T]: generate runs only the uncached last token
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids),  # type: ignore[operator]
                             cache=copy.deepcopy(cache), max_new_tokens=6, do_sample=False)
    generated: list[int] = out[0, ids.shape[1]:].tolist()
    return generated


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cache_round_trips_bit_for_bit(dtype: torch.dtype, tmp_path: Path) -> None:
    model = tiny_random_llama()
    hf = model.model.to(dtype)
    with torch.inference_mode():
        cache = DynamicCache()
        hf(input_ids=torch.tensor([PROMPT]), cache=cache, use_cache=True)
    saved = save_cache(cache, tmp_path / "c.skvc", model=hf, tokens=PROMPT)
    restored = load_cache(tmp_path / "c.skvc", model=hf)
    original = tensor_from_cache(cache)
    again = tensor_from_cache(restored)
    assert again.dtype == dtype
    assert torch.equal(original.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       again.view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert _continue(hf, restored, PROMPT) == _continue(hf, cache, PROMPT)
    assert saved.tokens == len(PROMPT) and saved.file_bytes > 0


def test_wrong_token_count_is_refused(tiny_model: CausalLM, tmp_path: Path) -> None:
    cache = tiny_model.prefill(PROMPT)
    with pytest.raises(InvalidKVError, match="sequences"):
        save_cache(cache, tmp_path / "c.skvc", model=tiny_model, tokens=PROMPT[:-1])


def test_other_files_are_refused(tiny_model: CausalLM, tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"not a cache file")
    with pytest.raises(NotASeqKVFileError, match="save_cache"):
        load_cache(tmp_path / "x", model=tiny_model)

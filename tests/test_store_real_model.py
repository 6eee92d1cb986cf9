"""The store with the embedded SmolLM2-135M: a short shared-prefix round trip and generation."""

from __future__ import annotations

import copy
import importlib.resources
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from seqkv.codec import DEFAULT_TOLERANCE
from seqkv.models import CausalLM
from seqkv.store import SessionStore, model_codecs
from seqkv.store.backends.directory import DirectoryBackend

pytestmark = pytest.mark.real_model


def _continue(model: CausalLM, cache: DynamicCache, tokens: list[int]) -> list[int]:
    ids = torch.tensor([[*tokens, *model.encode_text(" So")]])  # [1, T]
    with torch.inference_mode():
        out = model.model.generate(ids, attention_mask=torch.ones_like(ids),
                                   cache=copy.deepcopy(cache), max_new_tokens=6,
                                   do_sample=False)
    generated: list[int] = out[0, ids.shape[1]:].tolist()
    return generated


@pytest.mark.parametrize("level", ["rows", "ngram"])
def test_shared_prefix_round_trip_and_generation(real_model: CausalLM, tmp_path: Path,
                                                 level: str) -> None:
    text = (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8")
    system = real_model.encode_text(text)[:40]
    first = system + real_model.encode_text(" The keeper wrote every night.")
    second = system + real_model.encode_text(" Ships passed in the fog.")
    store = SessionStore(DirectoryBackend(tmp_path), model_codecs(real_model))
    store.put("a", first, real_model.prefill(first), level=level, namespace="t")
    kv = real_model.prefill(second)
    put = store.put("b", second, kv, level=level, namespace="t")
    assert put.shared_tokens == len(system)
    more = real_model.encode_text(" Then the light went out.")
    store.append("b", more, namespace="t")
    cold = SessionStore(DirectoryBackend(tmp_path), model_codecs(real_model))
    got = cold.get("b", namespace="t")
    assert got.tokens == second + more
    assert got.kv is not None and got.cache is not None
    original = real_model.kv_tensor(kv)
    assert (got.kv[:, :, :, : len(second)] - original).abs().max() <= DEFAULT_TOLERANCE
    head = cold.get("a", namespace="t")
    assert head.cache is not None
    assert _continue(real_model, head.cache, first) == _continue(
        real_model, real_model.prefill(first), first)

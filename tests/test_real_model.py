"""The codec on the embedded SmolLM2-135M-Instruct: exactness, code length, generation.

One model is loaded for the whole session (``real_model`` in conftest.py); texts are a few
hundred tokens so that the suite stays within CI's budget on 2 cores.
"""

from __future__ import annotations

import copy
import importlib.resources

import pytest
import torch
from transformers import DynamicCache

from seqkv import DEFAULT_TOLERANCE, compress, decompress
from seqkv.kvcache import tensor_from_cache
from seqkv.models import CausalLM
from seqkv.schedule import pinned_threads

pytestmark = pytest.mark.real_model


def _sample_tokens(model: CausalLM) -> list[int]:
    text = (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8")
    return model.encode_text(text)


def _continue(model: CausalLM, cache: DynamicCache, prompt: list[int], suffix: list[int]) -> (
    list[int]
):
    ids = torch.tensor([prompt + suffix])  # [1, T]: generate runs only the uncached suffix
    with torch.inference_mode():
        out = model.model.generate(
            ids, attention_mask=torch.ones_like(ids), cache=copy.deepcopy(cache),
            max_new_tokens=12, do_sample=False,
        )
    generated: list[int] = out[0, ids.shape[1]:].tolist()
    return generated


def test_sample_round_trip_code_length_and_generation(real_model: CausalLM) -> None:
    tokens = _sample_tokens(real_model)
    assert len(tokens) >= 512
    original = real_model.prefill(tokens)
    result = compress(real_model, tokens, kv=original)
    stats = result.stats
    # The code-length bound: cross-entropy + 2 bits of flush + the tables' quantization loss.
    assert stats.code_bits <= stats.cross_entropy_bits + 2 + 2e-5 * len(tokens)
    # The target for >= 512 tokens: within 0.5% of the cross-entropy.
    assert stats.code_bits <= 1.005 * stats.cross_entropy_bits

    decoded = decompress(real_model, result.data)
    assert decoded.tokens == tokens
    error = (decoded.kv - tensor_from_cache(original)).abs().max().item()
    assert error <= DEFAULT_TOLERANCE
    suffix = real_model.encode_text("\n\nIn one sentence, the lesson is")
    assert _continue(real_model, decoded.cache, tokens, suffix) == _continue(
        real_model, original, tokens, suffix
    )


def test_bit_exact_kv_continues_with_identical_logits(real_model: CausalLM) -> None:
    tokens = _sample_tokens(real_model)[:96]
    original = real_model.prefill(tokens)
    decoded = decompress(real_model, compress(real_model, tokens, kv=original, tolerance=0).data)
    assert torch.equal(decoded.kv, tensor_from_cache(original))
    nxt = torch.tensor([[tokens[-1]]])
    with torch.inference_mode():
        a = real_model.model(input_ids=nxt, cache=copy.deepcopy(original)).logits
        b = real_model.model(input_ids=nxt, cache=decoded.cache).logits
    assert torch.equal(a, b)


def test_token_by_token_schedule_repeats_bit_for_bit(real_model: CausalLM) -> None:
    """The premise the token coder rests on: one schedule, one thread count, identical bits."""
    tokens = _sample_tokens(real_model)[:24]

    def run() -> list[torch.Tensor]:
        stepper = real_model.new_stepper()
        with pinned_threads():
            return [torch.from_numpy(stepper.step(t)) for t in tokens]

    assert all(torch.equal(a, b) for a, b in zip(run(), run(), strict=True))

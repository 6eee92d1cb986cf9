"""Distortion metrics: the captured queries reproduce the model's attention (on the tiny Llama
through its modules, on every backbone family through the backbone), and identical caches have
zero distortion."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from backbone_cases import FAMILY_MODELS
from seqkv.delta.metrics import build_reference, kv_mse, kv_nmse, measure
from seqkv.errors import InsufficientSamplesError, InvalidKVError, UnsupportedModelError
from seqkv.kvcache import cache_from_tensor
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.models.backbones import backbone_for

PREFIX = list(range(5, 29))
CONTINUATION = list(range(40, 48))


@pytest.fixture(scope="module", params=sorted(FAMILY_MODELS))
def family_model(request: pytest.FixtureRequest) -> CausalLM:
    return FAMILY_MODELS[request.param]()


@pytest.fixture(scope="module")
def original(tiny_model: CausalLM) -> torch.Tensor:
    return tiny_model.kv_tensor(tiny_model.prefill(PREFIX))


def test_captured_queries_reproduce_the_models_attention_outputs(
    tiny_model: CausalLM, original: torch.Tensor
) -> None:
    reference = build_reference(tiny_model, original, CONTINUATION)
    full = tiny_model.kv_tensor(tiny_model.prefill(PREFIX + CONTINUATION))  # [L, 2, H, T+C, D]
    layers: Any = tiny_model.model.base_model.layers  # torch types it Tensor | Module
    outputs: dict[int, torch.Tensor] = {}
    handles = [
        layer.self_attn.register_forward_hook(
            lambda _m, _a, out, i=i: outputs.__setitem__(i, out[0].detach()))
        for i, layer in enumerate(layers)
    ]
    try:
        with torch.inference_mode():
            tiny_model.model(input_ids=torch.tensor([CONTINUATION]),
                             cache=cache_from_tensor(original), use_cache=True)
    finally:
        for handle in handles:
            handle.remove()
    count, total = len(CONTINUATION), len(PREFIX) + len(CONTINUATION)
    causal = torch.ones(count, total, dtype=torch.bool)
    causal[:, len(PREFIX):] = torch.tril(torch.ones(count, count, dtype=torch.bool))
    for i, layer in enumerate(layers):
        attention = layer.self_attn
        groups = attention.num_key_value_groups
        keys = full[i, 0].double().repeat_interleave(groups, 0)  # [Hq, T+C, D]
        values = full[i, 1].double().repeat_interleave(groups, 0)
        scores = reference.queries[i].double() @ keys.transpose(-1, -2) * attention.scaling
        scores = scores.masked_fill(~causal, float("-inf"))  # [Hq, C, T+C]
        heads = torch.softmax(scores, dim=-1) @ values  # [Hq, C, D]
        merged = heads.transpose(0, 1).reshape(count, -1).float()  # [C, Hq * D]
        with torch.inference_mode():
            projected = attention.o_proj(merged)
        assert torch.allclose(projected, outputs[i][0], atol=1e-6)


def test_captured_queries_reproduce_the_models_forward_on_every_family(
    family_model: CausalLM
) -> None:
    model = family_model
    original = model.kv_tensor(model.prefill(PREFIX))
    reference = build_reference(model, original, CONTINUATION)
    full = model.kv_tensor(model.prefill(PREFIX + CONTINUATION))  # [L, 2, H, T+C, D]
    backbone = backbone_for(model)
    geometry = backbone.geometry
    count, total = len(CONTINUATION), len(PREFIX) + len(CONTINUATION)
    causal = torch.ones(count, total, dtype=torch.bool)
    causal[:, len(PREFIX):] = torch.tril(torch.ones(count, count, dtype=torch.bool))

    def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention of the captured queries (not the block's) over the whole cache."""
        keys = full[index, 0].double().repeat_interleave(geometry.groups, 0)  # [Hq, T+C, D]
        values = full[index, 1].double().repeat_interleave(geometry.groups, 0)
        scores = reference.queries[index].double() @ keys.transpose(-1, -2) * geometry.scale
        scores = scores.masked_fill(~causal, float("-inf"))  # [Hq, C, T+C]
        heads = torch.softmax(scores, dim=-1) @ values  # [Hq, C, D]
        return heads.transpose(0, 1).float()  # [C, Hq, D]

    with torch.inference_mode():
        positions = torch.arange(len(PREFIX), total)
        cos, sin = backbone.rotary(positions)
        hidden = backbone.embed(torch.tensor(CONTINUATION))  # [C, hidden]
        for index in range(geometry.layers):
            hidden = backbone.block(index, hidden, cos, sin, attend)
        logits = backbone.head(hidden).double()  # [C, V]
    assert (torch.log_softmax(logits, dim=-1) - reference.log_probs).abs().max() < 1e-5
    assert len(reference.queries) == geometry.layers
    assert reference.queries[0].shape == (geometry.heads, count, geometry.head_dim)


def test_distortion_of_every_family(family_model: CausalLM) -> None:
    model = family_model
    original = model.kv_tensor(model.prefill(PREFIX))
    reference = build_reference(model, original, CONTINUATION)
    same = measure(model, reference, original.clone())
    assert same.kv_mse == same.attention_nmse == same.perplexity_change == 0.0
    noisy = measure(model, reference, original + 0.05)
    assert noisy.kl_bits > 0 and noisy.attention_nmse > 0
    assert noisy.kv_mse == pytest.approx(0.0025)


def test_a_model_without_a_backbone_is_refused(original: torch.Tensor) -> None:
    model = tiny_random_llama()
    model.config.model_type = "gpt2"
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        build_reference(model, original, CONTINUATION)


def test_identical_cache_has_zero_distortion(tiny_model: CausalLM,
                                             original: torch.Tensor) -> None:
    reference = build_reference(tiny_model, original, CONTINUATION)
    same = measure(tiny_model, reference, original.clone())
    assert same.kv_mse == same.attention_nmse == 0.0
    assert abs(same.kl_bits) < 1e-12
    assert same.perplexity_change == 0.0
    noisy = measure(tiny_model, reference,
                    original + 0.05 * torch.randn(original.shape,
                                                  generator=torch.Generator().manual_seed(0)))
    assert noisy.kl_bits > 0 and noisy.attention_nmse > 0
    assert noisy.kv_mse == pytest.approx(0.0025, rel=0.1)


def test_kv_errors() -> None:
    x = torch.ones(2, 3)
    assert kv_mse(x, 2 * x) == 1.0
    assert kv_nmse(x, 2 * x) == 1.0


def test_shapes_must_match() -> None:
    with pytest.raises(InvalidKVError, match="shapes differ"):
        kv_mse(torch.zeros(2), torch.zeros(3))


def test_a_continuation_needs_two_tokens(tiny_model: CausalLM, original: torch.Tensor) -> None:
    with pytest.raises(InsufficientSamplesError, match="at least 2 tokens"):
        build_reference(tiny_model, original, [5])


def test_decoded_kv_of_another_shape_is_refused(tiny_model: CausalLM,
                                                original: torch.Tensor) -> None:
    reference = build_reference(tiny_model, original, CONTINUATION)
    with pytest.raises(InvalidKVError, match="decoded KV has shape"):
        measure(tiny_model, reference, original[:, :, :, :-1])

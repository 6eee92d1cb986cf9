"""The premise measurements on the tiny model, against brute force."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backbone_cases import FAMILY_MODELS
from seqkv.checker.premises import (
    first_layer_kv,
    measure_determinism,
    measure_injectivity,
    min_pairwise_distance,
)
from seqkv.errors import UnsupportedModelError
from seqkv.models import CausalLM, tiny_random_llama


@settings(max_examples=30)
@given(st.integers(2, 90), st.integers(1, 8), st.integers(1, 40), st.integers(0, 2**31))
def test_min_pairwise_distance_matches_brute_force(
    rows: int, dims: int, chunk: int, seed: int
) -> None:
    x = torch.randn(rows, dims, generator=torch.Generator().manual_seed(seed))
    distance, (i, j) = min_pairwise_distance(x, chunk=chunk)
    brute = torch.cdist(x.double(), x.double())
    brute.fill_diagonal_(float("inf"))
    assert distance == pytest.approx(float(brute.min()), rel=1e-9, abs=1e-12)
    assert i != j and float((x[i].double() - x[j].double()).norm()) == pytest.approx(distance)


def test_injectivity_finds_tokens_sharing_an_embedding() -> None:
    model = tiny_random_llama(seed=0)
    with torch.no_grad():
        embedding = model.model.get_input_embeddings().weight
        embedding[7] = embedding[300]
        embedding[9] = embedding[11]
    result = measure_injectivity(model)
    assert set(result.collisions) == {(7, 300), (9, 11)}
    assert result.min_distance == 0.0 and not result.injective


def test_injective_model_reports_a_positive_minimum(tiny_model: CausalLM) -> None:
    result = measure_injectivity(tiny_model)
    rows = first_layer_kv(tiny_model).double()
    brute = torch.cdist(rows, rows)
    brute.fill_diagonal_(float("inf"))
    assert result.injective and result.min_distance == pytest.approx(float(brute.min()))


def test_determinism_repeat_is_exact(tiny_model: CausalLM) -> None:
    result = measure_determinism(tiny_model, list(range(3, 40)))
    assert result.repeat_logits == 0.0
    assert result.tokens == 37


@pytest.mark.parametrize("family", sorted(FAMILY_MODELS))
def test_first_layer_kv_is_what_the_model_caches_for_each_id_alone(family: str) -> None:
    model = FAMILY_MODELS[family]()
    rows = first_layer_kv(model)  # [V, 2 * H * D]
    with torch.inference_mode():
        output = model.model(input_ids=torch.arange(model.vocab_size)[:, None], use_cache=True)
    layer = output.cache.layers[0]  # keys, values: [V, H, 1, D]
    direct = torch.cat((layer.keys[:, :, 0].flatten(1), layer.values[:, :, 0].flatten(1)), dim=1)
    assert rows.shape == (model.vocab_size, 2 * model.kv_heads * model.head_dim)
    assert (rows - direct).abs().max() < 1e-6


def test_injectivity_of_a_model_without_a_backbone_is_refused() -> None:
    model = tiny_random_llama()
    model.config.model_type = "gpt2"
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        measure_injectivity(model)

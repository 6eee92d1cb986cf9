"""The integer form of a model: per-row fixed point within its bound, folded norms, a digest."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seqkv.errors import UnsupportedModelError
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.models.integer import IntegerConfig, IntegerForward, IntegerWeights
from seqkv.models.integer.weights import HIDDEN_FRAC, IntLinear, WeightPlanes


def _integers(linear: IntLinear) -> np.ndarray:
    """The integer weights ``q [N, K]`` recombined from their planes."""
    planes = linear.weight.numpy().astype(np.int64)
    if linear.planes == 1:
        return planes
    n = linear.out_features
    return (planes[:n] << 7) + planes[n:]


def _real(linear: IntLinear) -> np.ndarray:
    scale = linear.scale.numpy().astype(np.float64) * 2.0**-linear.scale_bits
    return _integers(linear) * scale[:, None]


@pytest.mark.parametrize("planes", [1, 2])
def test_weights_are_per_row_fixed_point_within_half_a_step(tiny_model: CausalLM,
                                                            planes: WeightPlanes) -> None:
    weights = IntegerWeights.from_model(tiny_model, IntegerConfig(weight_planes=planes))
    layer = weights.layers[0]
    source = tiny_model.model.model.layers[0]
    levels = 127 if planes == 1 else (1 << 14) - 1
    o_proj = source.self_attn.o_proj.weight.detach().double().numpy()
    step = np.abs(o_proj).max(axis=1, keepdims=True) / levels
    assert np.abs(_integers(layer.o)).max() == levels
    # half a step of rounding, plus the scale mantissa's relative 2**-(24 or 17)
    assert (np.abs(_real(layer.o) - o_proj) <= step * (0.5 + levels * 2.0**-16)).all()


def test_norm_weights_and_sqrt_k_fold_into_the_next_layer(tiny_model: CausalLM) -> None:
    weights = IntegerWeights.from_model(tiny_model)
    source = tiny_model.model.model.layers[1]
    gain = source.post_attention_layernorm.weight.detach().double().numpy()
    gate = source.mlp.gate_proj.weight.detach().double().numpy()
    up = source.mlp.up_proj.weight.detach().double().numpy()
    expected = np.concatenate([gate, up]) * gain[None, :] * math.sqrt(gate.shape[1])
    folded = _real(weights.layers[1].gate_up)
    step = np.abs(expected).max(axis=1, keepdims=True) / 127
    assert (np.abs(folded - expected) <= step * 0.51).all()


def test_two_planes_split_into_a_signed_and_a_seven_bit_plane(tiny_model: CausalLM) -> None:
    linear = IntegerWeights.from_model(tiny_model, IntegerConfig(weight_planes=2)).layers[0].o
    n = linear.out_features
    high, low = linear.weight[:n], linear.weight[n:]
    assert int(low.min()) >= 0 and int(low.max()) <= 127
    assert int(high.min()) >= -128 and int(high.max()) <= 127


def test_the_embedding_is_fixed_point_at_2_pow_minus_24(tiny_model: CausalLM) -> None:
    weights = IntegerWeights.from_model(tiny_model)
    table = tiny_model.model.model.embed_tokens.weight.detach().double().numpy()
    assert weights.embedding.dtype == torch.int32 and weights.embedding_frac == HIDDEN_FRAC
    assert np.abs(weights.embedding.numpy() / 2.0**HIDDEN_FRAC - table).max() <= 2.0**-25


def test_the_digest_is_deterministic_and_covers_weights_and_config(tiny_model: CausalLM) -> None:
    digest = IntegerWeights.from_model(tiny_model).digest()
    assert IntegerWeights.from_model(tiny_random_llama(seed=0)).digest() == digest
    assert IntegerWeights.from_model(tiny_random_llama(seed=1)).digest() != digest
    assert IntegerWeights.from_model(tiny_model, IntegerConfig(weight_planes=2)).digest() != digest
    assert len(digest) == 64 and int(digest, 16) >= 0


@pytest.mark.parametrize(("key", "value", "message"), [
    ("hidden_act", "gelu", "SiLU"),
    ("mlp_bias", True, "MLP biases"),
    ("use_sliding_window", True, "sliding"),
])
def test_unsupported_variants_are_refused(key: str, value: object, message: str) -> None:
    model = tiny_random_llama()
    setattr(model.config, key, value)
    with pytest.raises(UnsupportedModelError, match=message):
        IntegerWeights.from_model(model)


@pytest.mark.real_model
def test_the_real_models_q8_embedding_is_exact(real_model: CausalLM) -> None:
    weights = IntegerWeights.from_model(real_model)
    table = real_model.model.model.embed_tokens.weight.detach().double().numpy()
    assert weights.embedding_frac == HIDDEN_FRAC
    assert np.array_equal(weights.embedding.numpy() / 2.0**HIDDEN_FRAC, table)


def test_moving_the_weights_keeps_digest_and_rows(tiny_model: CausalLM) -> None:
    weights = IntegerWeights.from_model(tiny_model)
    moved = weights.to("cpu")
    assert moved.digest() == weights.digest()
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    first, second = (IntegerForward(w) for w in (weights, moved))
    assert np.array_equal(first.forward([(first.new_sequence(), tokens)])[0],
                          second.forward([(second.new_sequence(), tokens)])[0])

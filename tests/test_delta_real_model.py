"""Predictive delta coding on the embedded SmolLM2-135M: exact recompute leaves only numerical
noise, and the paper's top-k expectation lowers the residual against no prediction.

48 tokens of the shipped sample, one model for the session (``real_model`` in conftest.py)."""

from __future__ import annotations

import importlib.resources

import pytest
import torch

from seqkv.delta import (
    DeltaConfig,
    ExactRecompute,
    NoPrediction,
    TopKExpectation,
    decode_delta,
    encode_delta,
    store_tokens,
)
from seqkv.models import CausalLM

pytestmark = pytest.mark.real_model

NUM_TOKENS = 48


def test_exact_is_noise_and_top_k_lowers_the_residual(real_model: CausalLM) -> None:
    text = (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8")
    tokens = real_model.encode_text(text)[:NUM_TOKENS]
    kv = real_model.kv_tensor(real_model.prefill(tokens))
    store = store_tokens(real_model, tokens)

    exact = encode_delta(real_model, tokens, kv, DeltaConfig(ExactRecompute(), "int8", 8),
                         token_store=store)
    assert exact.residual.abs().max() < 1e-3  # prefill vs token-by-token: ~3e-5
    assert exact.residual_energy < 1e-8

    none = encode_delta(real_model, tokens, kv, DeltaConfig(NoPrediction(), "turboquant_mse", 4))
    top_k = encode_delta(real_model, tokens, kv,
                         DeltaConfig(TopKExpectation(k=20), "turboquant_mse", 4),
                         token_store=store)
    assert none.residual_energy == pytest.approx(1.0)
    assert top_k.residual_energy < 0.5 * none.residual_energy
    error_none = (kv - none.decoded).square().mean()
    error_top_k = (kv - top_k.decoded).square().mean()
    assert error_top_k < error_none

    decoded = decode_delta(real_model, top_k.code, tokens=tokens)
    assert torch.equal(decoded.kv, top_k.decoded)

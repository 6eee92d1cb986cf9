"""Tiny randomly initialised models: the models the fast tests and doctests run on.

One per backbone family (``seqkv.models.backbones``): a Llama (the default test model), Mistral and
Qwen2 (the Llama layout, Qwen2 with q/k/v biases) and GPT-NeoX (fused qkv, partial rotary,
LayerNorm, parallel or sequential residual). Their weights come from torch's generator seeded
with ``seed`` inside the call (its state is restored afterwards), so two calls with the same seed
give models with the same identity, and no call changes the caller's random stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from seqkv.models.adapter import CausalLM

# NOTE: the shapes every tiny model shares: 2 layers, hidden 64, 4 query heads of dimension 16,
# 4,096 positions (the row-invariant forward tabulates its rotary embedding for all of them).
_SHAPE: Mapping[str, Any] = MappingProxyType({
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 4096,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
})


def _seeded(seed: int, build: Callable[[], PreTrainedModel]) -> PreTrainedModel:
    """``build()`` with torch's generator seeded by ``seed``, its state restored afterwards."""
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return build()
    finally:
        torch.random.set_rng_state(generator_state)


def tiny_random_llama(seed: int = 0, vocab_size: int = 512, context: int = 4096) -> CausalLM:
    """A 2-layer Llama with 2 KV heads of dimension 16 (no tokenizer); ``context`` positions.

    >>> model = tiny_random_llama()
    >>> model.num_layers, model.kv_heads, model.head_dim, model.vocab_size
    (2, 2, 16, 512)
    """
    shape = {**_SHAPE, "max_position_embeddings": context}
    config = LlamaConfig(vocab_size=vocab_size, num_key_value_heads=2, head_dim=16, **shape)
    model = _seeded(seed, lambda: LlamaForCausalLM(config))
    suffix = "" if context == _SHAPE["max_position_embeddings"] else f"-context{context}"
    return CausalLM(model, None, f"tiny-random-llama-seed{seed}{suffix}")


def tiny_random_mistral(seed: int = 0, vocab_size: int = 512) -> CausalLM:
    """A 2-layer Mistral with 2 KV heads and no sliding window (no tokenizer).

    >>> tiny_random_mistral().config.model_type
    'mistral'
    """
    config = MistralConfig(vocab_size=vocab_size, num_key_value_heads=2, head_dim=16,
                           sliding_window=None, **_SHAPE)
    model = _seeded(seed, lambda: MistralForCausalLM(config))
    return CausalLM(model, None, f"tiny-random-mistral-seed{seed}")


def tiny_random_qwen2(seed: int = 0, vocab_size: int = 512) -> CausalLM:
    """A 2-layer Qwen2 with 2 KV heads and biases on its q/k/v projections (no tokenizer).

    Its biases start at zero in transformers' initialisation; they are drawn here too, so the
    tests see them act.

    >>> model = tiny_random_qwen2()
    >>> model.config.model_type, model.kv_heads, model.head_dim
    ('qwen2', 2, 16)
    """
    config = Qwen2Config(vocab_size=vocab_size, num_key_value_heads=2, use_sliding_window=False,
                         **_SHAPE)

    def build() -> PreTrainedModel:
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith("proj.bias"):
                    parameter.normal_(0.0, 0.5)
        return model

    return CausalLM(_seeded(seed, build), None, f"tiny-random-qwen2-seed{seed}")


def tiny_random_gpt_neox(seed: int = 0, vocab_size: int = 512,
                         parallel_residual: bool = True) -> CausalLM:
    """A 2-layer GPT-NeoX: 4 heads of dimension 16, the rotary embedding on the first quarter
    of each head (``rotary_pct`` 0.25), parallel or sequential residual (no tokenizer).

    >>> model = tiny_random_gpt_neox()
    >>> model.num_layers, model.kv_heads, model.head_dim, model.vocab_size
    (2, 4, 16, 512)
    """
    config = GPTNeoXConfig(
        vocab_size=vocab_size, use_parallel_residual=parallel_residual,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25},  # ``rotary_pct`` before transformers 5
        **_SHAPE)
    model = _seeded(seed, lambda: GPTNeoXForCausalLM(config))
    residual = "parallel" if parallel_residual else "sequential"
    return CausalLM(model, None, f"tiny-random-gpt-neox-{residual}-seed{seed}")

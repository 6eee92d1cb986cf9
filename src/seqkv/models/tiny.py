"""A tiny randomly initialised Llama: the model the fast tests and doctests run on.

Its weights come from a seeded generator, so two calls with the same seed give models with the
same identity.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from seqkv.models.adapter import CausalLM


def tiny_random_llama(seed: int = 0, vocab_size: int = 512) -> CausalLM:
    """A 2-layer Llama with 2 KV heads of dimension 16 (no tokenizer).

    >>> model = tiny_random_llama()
    >>> model.num_layers, model.kv_heads, model.head_dim, model.vocab_size
    (2, 2, 16, 512)
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return CausalLM(model, None, f"tiny-random-llama-seed{seed}")

"""Model adapters: any Hugging Face causal LM, its architecture's backbone
(``seqkv.models.backbones``), and the embedded default model."""

from seqkv.models.adapter import CausalLM, Stepper
from seqkv.models.loading import DEFAULT_MODEL_NAME, load_default_model, load_model
from seqkv.models.tiny import (
    tiny_random_gpt_neox,
    tiny_random_llama,
    tiny_random_mistral,
    tiny_random_qwen2,
)
from seqkv.types import ModelIdentity

__all__ = [
    "DEFAULT_MODEL_NAME",
    "CausalLM",
    "ModelIdentity",
    "Stepper",
    "load_default_model",
    "load_model",
    "tiny_random_gpt_neox",
    "tiny_random_llama",
    "tiny_random_mistral",
    "tiny_random_qwen2",
]

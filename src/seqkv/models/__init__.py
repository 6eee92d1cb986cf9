"""Model adapters: any Hugging Face causal LM, and the embedded default model."""

from seqkv.models.adapter import CausalLM, Stepper
from seqkv.models.loading import DEFAULT_MODEL_NAME, load_default_model, load_model
from seqkv.models.tiny import tiny_random_llama
from seqkv.types import ModelIdentity

__all__ = [
    "DEFAULT_MODEL_NAME",
    "CausalLM",
    "ModelIdentity",
    "Stepper",
    "load_default_model",
    "load_model",
    "tiny_random_llama",
]

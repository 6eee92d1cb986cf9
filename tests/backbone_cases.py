"""The tiny random model of every backbone family, shared by the tests that run each driver on
every family (``test_backbones``, ``test_delta_metrics``, ``test_delta_predictors``,
``test_checker_premises``). A new family adds its entry here."""

from __future__ import annotations

from collections.abc import Callable

from seqkv.models import CausalLM
from seqkv.models.tiny import (
    tiny_random_gpt_neox,
    tiny_random_llama,
    tiny_random_mistral,
    tiny_random_qwen2,
)

FAMILY_MODELS: dict[str, Callable[[], CausalLM]] = {
    "llama": tiny_random_llama,
    "mistral": tiny_random_mistral,
    "qwen2": tiny_random_qwen2,
    "gpt_neox": tiny_random_gpt_neox,
    "gpt_neox-sequential": lambda: tiny_random_gpt_neox(parallel_residual=False),
}
"""Test-case name -> builder; GPT-NeoX runs with its parallel and its sequential residual."""

"""The docstring examples of the warm tier and the vLLM connector's vLLM-free modules."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = (
    "seqkv.warm",
    "seqkv.warm.codec",
    "seqkv.warm.config",
    "seqkv.integrations.vllm.keys",
    "seqkv.integrations.vllm.paged",
    "seqkv.integrations.vllm.scheduler",
    "seqkv.integrations.vllm.settings",
    "seqkv.integrations.vllm.worker",
)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

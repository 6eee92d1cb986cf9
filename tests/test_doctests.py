"""The docstring examples of seqkv's core modules run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = (
    "seqkv.codec",
    "seqkv.skv",
    "seqkv.digests",
    "seqkv.formats.framing",
    "seqkv.kvcache",
    "seqkv.progress",
    "seqkv.levels.drafts",
    "seqkv.models.integer.blocks",
    "seqkv.models.tiny",
    *(f"seqkv.quantizers.{name}" for name in (
        "bitpack", "kivi", "lloyd_max", "rotation", "turboquant", "uniform")),
    "seqkv.quantizers",
    "seqkv.warm",
    "seqkv.warm.codec",
    "seqkv.warm.config",
    "seqkv.warm.exact",
    "seqkv.delta.closed_loop",
    "seqkv.formats.warm_entry",
    *(f"seqkv.integrations.vllm.{name}" for name in (
        "keys", "paged", "scheduler", "settings", "worker")),
)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

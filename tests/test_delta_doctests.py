"""The docstring examples of the delta modules run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", [
    "seqkv.delta.bit_allocation", "seqkv.delta.delta_codec", "seqkv.delta.residual_coder",
    "seqkv.delta.metrics", "seqkv.delta.predictors.none", "seqkv.delta.predictors.previous_token",
    "seqkv.delta.predictors.topk_expectation", "seqkv.delta.predictors.exact_recompute",
])
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

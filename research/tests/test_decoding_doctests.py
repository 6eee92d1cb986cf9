"""The docstring examples of seqkv.decoding run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = tuple(f"research.decoding.{name}" for name in (
    "blocked", "drafts", "plan", "probes", "speculative"))


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

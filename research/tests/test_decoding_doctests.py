"""The docstring examples of the lab's decoding prototypes (research.decoding) run as written.

The draft helpers moved into the package (``seqkv.levels.drafts``); tests/test_doctests.py runs
theirs.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = tuple(f"research.decoding.{name}" for name in (
    "blocked", "plan", "probes", "speculative"))


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

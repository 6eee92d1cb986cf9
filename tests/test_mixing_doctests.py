"""The docstring examples of seqkv.mixing run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ("seqkv.mixing.dictionary", "seqkv.mixing.fixedpoint", "seqkv.mixing.mixer")


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

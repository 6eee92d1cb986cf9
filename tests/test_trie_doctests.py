"""The docstring examples of the trie's modules run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = (
    "seqkv.trie.keys",
    "seqkv.trie.metric",
    "seqkv.trie.radix",
    "seqkv.trie.clusters",
    "seqkv.trie.cache",
    "seqkv.trie.core",
    "seqkv.store.pins",
)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_importing_the_package_holds_no_mutable_state() -> None:
    import seqkv.trie as package

    mutable = (list, dict, set, bytearray)
    for name in dir(package):
        module = getattr(package, name)
        is_module = hasattr(module, "__file__")
        if is_module and getattr(module, "__name__", "").startswith("seqkv.trie."):
            for value_name, value in vars(module).items():
                if not value_name.startswith("__"):
                    assert not isinstance(value, mutable), f"{module.__name__}.{value_name}"

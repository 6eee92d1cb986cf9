"""A ``SessionStore`` as the prefix source of ``.skv`` files (``seqkv.store.pins``): a file
compressed against a stored session's pinned prefix decompresses with the store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import seqkv
import seqkv.store.pins as pins
import seqkv.store.store as store_module
from seqkv.models import CausalLM
from seqkv.store import SessionStore
from seqkv.store.errors import InvalidSessionIdError
from seqkv.store.pins import pin_name
from seqkv.trie import PrefixHashMismatchError, PrefixNotFoundError, prefix_hash
from seqkv.trie.keys import Namespace

SYSTEM = [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56]
FIRST = [*SYSTEM, 7, 8, 9, 10]
SECOND = [*SYSTEM, 300, 301, 302, 303, 304, 305]


def test_a_file_coded_against_a_pinned_prefix_decompresses_with_the_store(
        tiny_model: CausalLM, tmp_path: Path) -> None:
    store = SessionStore.directory(tmp_path / "s", tiny_model)
    store.put("first", FIRST, tiny_model.prefill(FIRST), namespace="n")
    prefix = store.pin_prefix("first", len(SYSTEM), namespace="n")
    assert prefix.prefix_hash == prefix_hash(Namespace("n"), SYSTEM)
    assert store.pin_prefix("first", len(SYSTEM), namespace="n").prefix_hash == prefix.prefix_hash
    result = seqkv.compress(tiny_model, SECOND, kv=tiny_model.prefill(SECOND), prefix=prefix)
    assert result.stats.prefix_tokens == len(SYSTEM)
    store.delete("first", namespace="n")  # the pin holds its own reference to the chain
    fresh = SessionStore.directory(tmp_path / "s", tiny_model)  # another process: a cold trie
    decoded = seqkv.decompress(tiny_model, result.data,
                               prefixes=fresh.prefix_source(namespace="n"))
    assert decoded.tokens == SECOND


def test_an_unknown_hash_is_the_named_error(tiny_model: CausalLM, tmp_path: Path) -> None:
    store = SessionStore.directory(tmp_path / "s", tiny_model)
    store.put("first", FIRST, tiny_model.prefill(FIRST), namespace="n")
    prefix = store.pin_prefix("first", len(SYSTEM), namespace="n")
    data = seqkv.compress(tiny_model, SECOND, kv=tiny_model.prefill(SECOND), prefix=prefix).data
    with pytest.raises(PrefixNotFoundError, match="pins no prefix"):
        seqkv.decompress(tiny_model, data, prefixes=store.prefix_source(namespace="other"))


WRONG = [2, *SYSTEM[1:]]


def _forged(tiny_model: CausalLM, tmp_path: Path) -> SessionStore:
    """A store whose pin row for the hash of ``SYSTEM`` holds other tokens (written past the
    put's name check, as a damaged or hand-edited row would be)."""
    store = SessionStore.directory(tmp_path / "s", tiny_model)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_module, "_check_pin_name", lambda name, tenant, tokens: None)
        store.put(pin_name(prefix_hash(Namespace("n"), SYSTEM)), WRONG,
                  tiny_model.prefill(WRONG), namespace="n")
    return store


def test_a_put_under_a_pin_name_holds_only_the_tokens_it_names(
        tiny_model: CausalLM, tmp_path: Path) -> None:
    store = SessionStore.directory(tmp_path / "s", tiny_model)
    name = pin_name(prefix_hash(Namespace("n"), SYSTEM))
    with pytest.raises(InvalidSessionIdError, match="not these tokens' hash"):
        store.put(name, WRONG, tiny_model.prefill(WRONG), namespace="n")
    store.put(name, SYSTEM, tiny_model.prefill(SYSTEM), namespace="n")  # its own tokens: kept
    with pytest.raises(InvalidSessionIdError, match="pinned prefix"):
        store.append(name, [7, 8], namespace="n")
    assert store.get(name, namespace="n").tokens == SYSTEM


def test_a_pin_row_with_other_tokens_is_refused(tiny_model: CausalLM, tmp_path: Path) -> None:
    source = _forged(tiny_model, tmp_path).prefix_source(namespace="n")
    with pytest.raises(PrefixHashMismatchError, match="hash to something else"):
        source.resolve(prefix_hash(Namespace("n"), SYSTEM))


def test_the_refusal_test_catches_a_source_that_does_not_rehash(
        tiny_model: CausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = prefix_hash(Namespace("n"), SYSTEM)
    monkeypatch.setattr(pins, "content_hash", lambda namespace, tokens: wanted)
    resolved = _forged(tiny_model, tmp_path).prefix_source(namespace="n").resolve(wanted)
    assert resolved.tokens[0] == 2  # the wrong tokens came back


@pytest.mark.parametrize("length", [0, len(FIRST) + 1])
def test_a_pin_outside_the_session_is_refused(tiny_model: CausalLM, tmp_path: Path,
                                              length: int) -> None:
    from seqkv.errors import InvalidTokensError

    store = SessionStore.directory(tmp_path / "s", tiny_model)
    store.put("first", FIRST, tiny_model.prefill(FIRST), namespace="n")
    with pytest.raises(InvalidTokensError):
        store.pin_prefix("first", length, namespace="n")


def test_pinning_a_prefix_pinned_before_returns_the_pinned_kv(tiny_model: CausalLM,
                                                              tmp_path: Path) -> None:
    """A second session holding the same prefix tokens with other KV bits: pinning it returns
    the KV the first pin holds, so a file coded against it decodes with the store."""
    store = SessionStore.directory(tmp_path / "s", tiny_model)
    store.put("first", FIRST, tiny_model.prefill(FIRST), namespace="n")
    pinned = store.pin_prefix("first", len(SYSTEM), namespace="n")
    other = tiny_model.kv_tensor(tiny_model.prefill(SECOND)) + 1e-3  # not the first's bits
    store.put("second", SECOND, other, namespace="n")
    again = store.pin_prefix("second", len(SYSTEM), namespace="n")
    assert again.kv is not None and pinned.kv is not None
    assert torch.equal(again.kv, pinned.kv)
    third = [*SYSTEM, 9, 9, 9]
    data = seqkv.compress(tiny_model, third, kv=tiny_model.prefill(third), prefix=again).data
    decoded = seqkv.decompress(tiny_model, data, prefixes=store.prefix_source(namespace="n"))
    assert decoded.tokens == third

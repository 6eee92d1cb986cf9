"""A .skv file that references a shared prefix held in a PrefixTrie and codes only its tail."""

from __future__ import annotations

import pytest
import torch

from seqkv import compress, decompress
from seqkv.errors import (
    InvalidTokensError,
    PrefixMismatchError,
    PrefixUnavailableError,
    SeqKVError,
)
from seqkv.kvcache import tensor_from_cache
from seqkv.models import CausalLM
from seqkv.trie import PrefixNotFoundError, PrefixTrie

SYSTEM = [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]
FIRST = [*SYSTEM, 7, 8, 9, 10]
SECOND = [*SYSTEM, 300, 301, 302, 303, 304, 305]


def _store(model: CausalLM, trie: PrefixTrie, tokens: list[int]) -> None:
    kv = model.prefill(tokens)
    result = compress(model, tokens, kv=kv)
    trie.insert(tokens, -result.trace.surprisal_bits, tensor_from_cache(kv), lock=False)


@pytest.fixture
def trie(tiny_model: CausalLM) -> PrefixTrie:
    trie = PrefixTrie()
    _store(tiny_model, trie, FIRST)
    return trie


def _compress_second(model: CausalLM, trie: PrefixTrie) -> tuple[bytes, torch.Tensor, int]:
    match = trie.match(SECOND)
    assert match.length == len(SYSTEM)
    kv = tensor_from_cache(model.prefill(SECOND))
    result = compress(model, SECOND, kv=kv, prefix=trie.resolve(match.prefix_hash))
    assert result.stats.tokens == len(SECOND) - len(SYSTEM)
    assert result.stats.prefix_tokens == len(SYSTEM)
    return result.data, kv, result.stats.code_bits


def test_tail_only_round_trip(tiny_model: CausalLM, trie: PrefixTrie) -> None:
    data, kv, tail_bits = _compress_second(tiny_model, trie)
    decoded = decompress(tiny_model, data, prefixes=trie)
    assert decoded.tokens == SECOND
    assert (decoded.kv - kv).abs().max().item() <= 1e-4
    assert tail_bits < compress(tiny_model, SECOND).stats.code_bits


def test_missing_trie_is_a_clear_error(tiny_model: CausalLM, trie: PrefixTrie) -> None:
    data, _, _ = _compress_second(tiny_model, trie)
    with pytest.raises(PrefixUnavailableError, match="pass the PrefixTrie"):
        decompress(tiny_model, data)


def test_evicted_prefix_is_a_clear_error(tiny_model: CausalLM, trie: PrefixTrie) -> None:
    data, _, _ = _compress_second(tiny_model, trie)
    trie.evict(10**12)
    with pytest.raises(PrefixNotFoundError) as raised:
        decompress(tiny_model, data, prefixes=trie)
    assert isinstance(raised.value, SeqKVError)


def test_prefix_with_other_kv_is_refused(tiny_model: CausalLM, trie: PrefixTrie) -> None:
    data, _, _ = _compress_second(tiny_model, trie)
    other = PrefixTrie()
    kv = tensor_from_cache(tiny_model.prefill(FIRST)) + 1e-3
    other.insert(FIRST, [-1.0] * len(FIRST), kv, lock=False)
    other.match(SECOND)  # splits FIRST's edge at the shared prefix, as the encoder's trie did
    with pytest.raises(PrefixMismatchError, match="not the one"):
        decompress(tiny_model, data, prefixes=other)


def test_prefix_must_be_a_proper_prefix(tiny_model: CausalLM, trie: PrefixTrie) -> None:
    prefix = trie.resolve(trie.match(SECOND).prefix_hash)
    with pytest.raises(InvalidTokensError, match="proper prefix"):
        compress(tiny_model, FIRST[:5], prefix=prefix)

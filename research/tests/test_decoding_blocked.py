"""Blocked verification on the tiny random Llama: any draft policy decodes a blocked prefill."""

from __future__ import annotations

import pytest
from decoding_cases import greedy_sequence, random_tokens, repetitive_tokens
from hypothesis import given
from hypothesis import strategies as st

from research.decoding import (
    DraftPolicy,
    Fallback,
    JacobiDraft,
    NoDraft,
    PromptLookup,
    blocked_decode,
    blocked_encode,
)
from research.decoding.blocked import partition
from seqkv import compress
from seqkv.errors import EmptyInputError
from seqkv.formats.skv import read_skv
from seqkv.kvcache import tensor_from_cache
from seqkv.models import CausalLM

policies = st.sampled_from([
    NoDraft(), PromptLookup(max_draft=3), JacobiDraft(max_draft=16),
    Fallback(PromptLookup(), JacobiDraft()),
])


@given(st.one_of(random_tokens, repetitive_tokens()), st.integers(1, 9), policies)
def test_round_trip(tiny_model: CausalLM, tokens: list[int], block: int,
                    policy: DraftPolicy) -> None:
    coded = blocked_encode(tiny_model, tokens, block)
    decoded = blocked_decode(tiny_model, coded, policy)
    assert decoded.tokens == tokens
    assert decoded.cross_entropy_bits == coded.cross_entropy_bits
    assert tensor_from_cache(decoded.cache).equal(tensor_from_cache(coded.cache))
    assert coded.code.num_bits <= coded.ideal_code_bits + 2
    assert coded.ideal_code_bits <= coded.cross_entropy_bits + 2e-5 * len(tokens)
    blocks = len(coded.blocks)
    assert coded.blocks == partition(len(tokens), block)
    assert blocks <= decoded.stats.forwards <= len(tokens) + blocks


@given(random_tokens)
def test_blocks_of_one_are_the_codec_schedule(tiny_model: CausalLM, tokens: list[int]) -> None:
    coded = blocked_encode(tiny_model, tokens, blocks=1)
    result = compress(tiny_model, tokens, level="tokens")
    assert coded.code == read_skv(result.data).session.token_code


def test_policies_only_change_the_cost(tiny_model: CausalLM) -> None:
    tokens = [7, 300, 41, 9, 88] * 6 + greedy_sequence(tiny_model, 11, 20)
    coded = blocked_encode(tiny_model, tokens, blocks=8)
    forwards = {}
    for policy in (NoDraft(), PromptLookup(), JacobiDraft(), Fallback(PromptLookup(),
                                                                       JacobiDraft())):
        decoded = blocked_decode(tiny_model, coded, policy)
        assert decoded.tokens == tokens
        forwards[policy.name] = decoded.stats.forwards
    assert forwards["lookup8+jacobi8"] < forwards["none"]
    assert forwards["lookup8"] < forwards["none"]


@given(random_tokens, st.lists(st.integers(1, 6), min_size=1, max_size=40))
def test_any_partition_round_trips(tiny_model: CausalLM, tokens: list[int],
                                   lengths: list[int]) -> None:
    blocks = []
    while sum(blocks) < len(tokens):
        blocks.append(min(lengths[len(blocks) % len(lengths)], len(tokens) - sum(blocks)))
    coded = blocked_encode(tiny_model, tokens, blocks)
    assert coded.blocks == tuple(blocks)
    assert blocked_decode(tiny_model, coded, PromptLookup()).tokens == tokens


def test_block_must_be_positive(tiny_model: CausalLM) -> None:
    with pytest.raises(ValueError, match="block must be a positive"):
        blocked_encode(tiny_model, [1, 2, 3], blocks=0)


def test_partition_must_cover_the_tokens(tiny_model: CausalLM) -> None:
    with pytest.raises(ValueError, match="sum to the 3 positions"):
        blocked_encode(tiny_model, [1, 2, 3], blocks=[1, 1])


def test_partition_lengths_must_be_positive(tiny_model: CausalLM) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        blocked_encode(tiny_model, [1, 2, 3], blocks=[4, -1])


def test_empty_tokens_raise(tiny_model: CausalLM) -> None:
    with pytest.raises(EmptyInputError):
        blocked_encode(tiny_model, [])

"""Replayed speculative decoding on the tiny random Llama: exact round trips, exact bit counts."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
from decoding_cases import VOCAB, greedy_sequence, random_tokens, repetitive_tokens
from hypothesis import given
from hypothesis import strategies as st
from transformers import DynamicCache

from research.decoding import (
    DraftPolicy,
    Fallback,
    JacobiDraft,
    NoDraft,
    PromptLookup,
    speculative_decode,
    speculative_encode,
)
from research.decoding.forward import forward_rows, greedy
from seqkv import compress
from seqkv.errors import EmptyInputError, InvalidTokensError
from seqkv.formats.skv import read_skv
from seqkv.kvcache import tensor_from_cache
from seqkv.models import CausalLM

policies = st.one_of(
    st.just(NoDraft()),
    st.builds(PromptLookup, max_ngram=st.integers(1, 4), max_draft=st.integers(0, 7)),
    st.builds(JacobiDraft, max_draft=st.integers(0, 7)),
    st.builds(lambda a, b: Fallback(PromptLookup(max_draft=a), JacobiDraft(max_draft=b)),
              st.integers(1, 7), st.integers(1, 7)),
)




@given(st.one_of(random_tokens, repetitive_tokens()), policies)
def test_round_trip(tiny_model: CausalLM, tokens: list[int], policy: DraftPolicy) -> None:
    coded = speculative_encode(tiny_model, tokens, policy)
    decoded = speculative_decode(tiny_model, coded, policy)
    assert decoded.tokens == tokens
    # Same forwards on both sides: the same rows, the same costs, the same cache bits.
    assert decoded.cross_entropy_bits == coded.cross_entropy_bits
    assert decoded.ideal_code_bits == coded.ideal_code_bits
    assert decoded.stats == coded.stats
    assert tensor_from_cache(decoded.cache).equal(tensor_from_cache(coded.cache))
    assert tensor_from_cache(decoded.cache).shape[3] == len(tokens)
    assert coded.code.num_bits <= coded.ideal_code_bits + 2
    assert coded.ideal_code_bits <= coded.cross_entropy_bits + 2e-5 * len(tokens)
    assert coded.stats.tokens_per_forward >= 1 - 1 / len(tokens)


@given(random_tokens)
def test_no_draft_is_the_codec_schedule(tiny_model: CausalLM, tokens: list[int]) -> None:
    coded = speculative_encode(tiny_model, tokens, NoDraft())
    result = compress(tiny_model, tokens, level="tokens")
    assert coded.code == read_skv(result.data).session.token_code
    assert coded.cross_entropy_bits == pytest.approx(result.stats.cross_entropy_bits, abs=1e-9)
    assert coded.stats.forwards == len(tokens)


def test_prompt_lookup_accepts_repeats(tiny_model: CausalLM) -> None:
    tokens = [7, 300, 41, 9, 88] * 8
    coded = speculative_encode(tiny_model, tokens, PromptLookup(max_draft=8))
    assert coded.stats.accepted >= 30
    assert coded.stats.forwards <= 10
    assert speculative_decode(tiny_model, coded, PromptLookup(max_draft=8)).tokens == tokens


@dataclass
class RecordingDraft:
    """Jacobi guesses, recording each call's context, hints and draft."""

    inner: JacobiDraft
    calls: list[tuple[list[int], list[int], list[int]]] = field(default_factory=list)
    name: str = "recording"

    def draft(self, context: Sequence[int], hints: Sequence[int], limit: int) -> list[int]:
        guesses = self.inner.draft(context, hints, limit)
        self.calls.append((list(context), list(hints), guesses))
        return guesses


def test_hints_are_the_greedy_guesses_after_the_rejected_one(tiny_model: CausalLM) -> None:
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, VOCAB, 30)]
    policy = RecordingDraft(JacobiDraft(max_draft=5))
    speculative_encode(tiny_model, tokens, policy)
    checked = 0
    for (before, _, guesses), (after, hints, _) in itertools.pairwise(policy.calls):
        if not hints:
            continue
        # A prefill over the previous chunk's inputs: the same rows up to rounding.
        rows = forward_rows(tiny_model.model, DynamicCache(), before + guesses)
        assert hints == greedy(rows[len(after) - 1 : len(before) + len(guesses)])
        checked += 1
    assert checked > 10


def test_jacobi_guesses_every_forward(tiny_model: CausalLM) -> None:
    tokens = greedy_sequence(tiny_model, 5, 24)
    coded = speculative_encode(tiny_model, tokens, JacobiDraft(max_draft=4))
    assert coded.stats.drafted >= 4 * (coded.stats.forwards - 4)
    assert speculative_decode(tiny_model, coded, JacobiDraft(max_draft=4)).tokens == tokens


def test_another_policy_does_not_decode(tiny_model: CausalLM) -> None:
    tokens = [7, 300, 41, 9, 88] * 4 + [3, 1, 4, 1, 5, 9, 2, 6]
    coded = speculative_encode(tiny_model, tokens, PromptLookup(max_draft=4))
    assert speculative_decode(tiny_model, coded, NoDraft()).tokens != tokens


def test_empty_tokens_raise(tiny_model: CausalLM) -> None:
    with pytest.raises(EmptyInputError):
        speculative_encode(tiny_model, [], NoDraft())


def test_out_of_vocabulary_tokens_raise(tiny_model: CausalLM) -> None:
    with pytest.raises(InvalidTokensError):
        speculative_encode(tiny_model, [1, VOCAB], NoDraft())

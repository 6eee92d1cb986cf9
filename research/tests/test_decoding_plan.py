"""The encoder's block planner: its cost simulation matches the decoder, its plan is optimal."""

from __future__ import annotations

import itertools

import pytest
from decoding_cases import random_tokens, repetitive_tokens
from hypothesis import given
from hypothesis import strategies as st

from research.decoding import NoDraft, PromptLookup, blocked_decode, blocked_encode
from research.decoding.blocked import bounds
from research.decoding.plan import block_forwards, plan_blocks, table_cost
from seqkv.models import CausalLM

LENGTHS = (1, 2, 4, 8)


def cost(length: int) -> float:
    return 1.0 + 0.1 * length  # a forward's fixed weight traffic plus a per-position part


@given(st.one_of(random_tokens, repetitive_tokens()),
       st.sampled_from([NoDraft(), PromptLookup(), PromptLookup(min_ngram=2, max_draft=3)]))
def test_simulated_forwards_are_the_decoders(tiny_model: CausalLM, tokens: list[int],
                                             policy: PromptLookup | NoDraft) -> None:
    plan = plan_blocks(tokens, PromptLookup(), cost, LENGTHS)
    coded = blocked_encode(tiny_model, tokens, plan)
    decoded = blocked_decode(tiny_model, coded, policy)
    assert decoded.tokens == tokens
    simulated = sum(block_forwards(tokens, s, e, policy) for s, e in bounds(plan))
    assert decoded.stats.forwards == simulated


def compositions(count: int) -> list[tuple[int, ...]]:
    """Every partition of ``count`` positions into blocks of the allowed lengths."""
    out = []
    for cuts in itertools.product([False, True], repeat=count - 1):
        ends = [i + 1 for i, cut in enumerate(cuts) if cut] + [count]
        lengths = tuple(e - s for s, e in zip([0, *ends[:-1]], ends, strict=True))
        if all(length in LENGTHS for length in lengths):
            out.append(lengths)
    return out


@given(repetitive_tokens().filter(lambda t: len(t) <= 9))
def test_plan_is_optimal(tokens: list[int]) -> None:
    policy = PromptLookup()

    def total(plan: tuple[int, ...]) -> float:
        return sum(block_forwards(tokens, s, e, policy) * cost(e - s) for s, e in bounds(plan))

    plan = plan_blocks(tokens, policy, cost, LENGTHS)
    assert sum(plan) == len(tokens)
    assert total(plan) == pytest.approx(min(total(p) for p in compositions(len(tokens))))


def test_nothing_to_guess_plans_the_codec_schedule() -> None:
    tokens = list(range(40))
    assert plan_blocks(tokens, PromptLookup(), cost) == (1,) * 40


def test_repeats_plan_long_blocks() -> None:
    tokens = list(range(20)) * 3
    plan = plan_blocks(tokens, PromptLookup(max_draft=32), cost, (1, 8, 16, 32))
    assert max(plan) >= 16 and len(plan) < 30


def test_lengths_must_include_one() -> None:
    with pytest.raises(ValueError, match="include 1"):
        plan_blocks([1, 2, 3], NoDraft(), cost, (2, 4))


def test_table_cost_needs_a_measurement() -> None:
    with pytest.raises(ValueError, match="no measured cost"):
        table_cost({1: 0.05, 4: 0.07})(8)

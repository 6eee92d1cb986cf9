"""Draft policies against their specification: pure functions of the decoded context."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import InvalidLevelError
from seqkv.levels.drafts import Fallback, JacobiDraft, NoDraft, PromptLookup

small_tokens = st.lists(st.integers(0, 5), min_size=1, max_size=30)


def occurrences(tokens: list[int], n: int) -> list[int]:
    """Starts of earlier occurrences of the last n tokens (ending before the suffix starts)."""
    if n >= len(tokens):
        return []
    suffix = tokens[-n:]
    return [s for s in range(len(tokens) - n) if tokens[s : s + n] == suffix]


@given(small_tokens, st.integers(1, 4), st.integers(1, 4), st.integers(0, 9), st.integers(0, 9))
def test_prompt_lookup_matches_its_specification(
    tokens: list[int], low: int, extra: int, max_draft: int, limit: int
) -> None:
    policy = PromptLookup(max_ngram=low + extra - 1, min_ngram=low, max_draft=max_draft)
    draft = policy.draft(tokens, [], limit)
    lengths = [n for n in range(policy.max_ngram, low - 1, -1) if occurrences(tokens, n)]
    if not lengths or min(limit, max_draft) == 0:
        assert draft == []
        return
    n = lengths[0]  # the longest n-gram with an earlier occurrence wins
    start = max(occurrences(tokens, n))  # its most recent occurrence
    assert len(draft) == min(limit, max_draft)
    # The draft is what follows the occurrence, reading on into the draft itself.
    assert (tokens + draft)[start + n : start + n + len(draft)] == draft


@given(small_tokens, st.lists(st.integers(0, 5), max_size=10), st.integers(0, 9),
       st.integers(0, 9))
def test_jacobi_takes_hints_then_repeats_the_last_token(
    tokens: list[int], hints: list[int], max_draft: int, limit: int
) -> None:
    draft = JacobiDraft(max_draft).draft(tokens, hints, limit)
    length = min(limit, max_draft)
    assert len(draft) == length
    assert draft == (hints + [tokens[-1]] * length)[:length]


@given(small_tokens, st.lists(st.integers(0, 5), max_size=10), st.integers(0, 9))
def test_fallback_and_purity(tokens: list[int], hints: list[int], limit: int) -> None:
    lookup, jacobi = PromptLookup(), JacobiDraft()
    policy = Fallback(lookup, jacobi)
    first = policy.draft(tokens, hints, limit)
    assert first == policy.draft(list(tokens), list(hints), limit)  # no hidden state
    assert first == (lookup.draft(tokens, hints, limit) or jacobi.draft(tokens, hints, limit))
    assert NoDraft().draft(tokens, hints, limit) == []


def test_names() -> None:
    policy = Fallback(PromptLookup(max_draft=4), JacobiDraft(max_draft=2))
    assert (NoDraft().name, policy.name) == ("none", "lookup4+jacobi2")


def test_policies_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        PromptLookup().max_draft = 3  # type: ignore[misc]


def test_negative_max_draft_raises() -> None:
    with pytest.raises(InvalidLevelError, match="max_draft must be >= 0"):
        PromptLookup(max_draft=-1)


def test_jacobi_negative_max_draft_raises() -> None:
    with pytest.raises(InvalidLevelError, match="max_draft must be >= 0"):
        JacobiDraft(max_draft=-1)


def test_ngram_bounds_raise() -> None:
    with pytest.raises(InvalidLevelError, match="min_ngram <= max_ngram"):
        PromptLookup(max_ngram=2, min_ngram=3)

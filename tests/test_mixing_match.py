"""The mixer's predictors against brute force: real matches, longest matches, top followers."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from seqkv.mixing.dictionary import Dictionary
from seqkv.mixing.fixedpoint import TOTAL
from seqkv.mixing.match import (
    Confidence,
    DictionaryIndex,
    DictionaryNgram,
    MatchModel,
    SessionSource,
)

VOCAB = 64


def _index(content: list[int], min_length: int = 3) -> DictionaryIndex:
    return DictionaryIndex(Dictionary(content, [len(content)] if content else [], VOCAB),
                           min_length)


def _feed(model: MatchModel, history: list[int], tokens: list[int]) -> list[int | None]:
    """The model's prediction before each token."""
    predicted = []
    for token in tokens:
        prediction = model.prediction()
        predicted.append(None if prediction is None else prediction.token)
        history.append(token)
        model.update(history, token)
    return predicted


def test_following_lists_positions_after_each_occurrence() -> None:
    index = _index([1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3])
    assert sorted(index.following([7, 1, 2, 3])) == [3, 7]  # the last occurrence has no follower
    assert index.following([1, 2]) == []  # shorter than min_length
    assert index.following([4, 5, 6]) == []


def test_a_copied_passage_is_predicted_after_min_length_tokens() -> None:
    rng = np.random.default_rng(0)
    content = rng.integers(0, VOCAB, 200).tolist()
    model = MatchModel(_index(content), 3)
    predicted = _feed(model, [], content[50:120])
    assert predicted[:3] == [None, None, None]
    assert predicted[3:] == content[53:120]


def _next_after(content: list[int], tokens: list[int]) -> int | None:
    model = MatchModel(_index(content), 3)
    _feed(model, [], tokens)
    prediction = model.prediction()
    return None if prediction is None else prediction.token


def test_the_longest_match_wins_and_ties_go_to_the_newest() -> None:
    content = [9, 1, 2, 3, 20, 11, 1, 2, 3, 30]
    assert _next_after(content, [9, 1, 2, 3]) == 20  # older, but 4 tokens long
    assert _next_after(content, [5, 1, 2, 3]) == 30  # 3 tokens each: the newest


@given(st.lists(st.integers(0, 5), min_size=1, max_size=120),
       st.lists(st.integers(0, 5), max_size=120), st.integers(1, 4))
def test_every_match_is_real_and_none_is_missed(content: list[int], session: list[int],
                                                min_length: int) -> None:
    index = _index(content, min_length)
    model = MatchModel(index, min_length)
    history: list[int] = []
    for token in session:
        history.append(token)
        model.update(history, token)
        if model.pointer >= 0:
            assert model.length >= min_length
            for i in range(min(model.length, len(history))):
                assert content[model.pointer - 1 - i] == history[-1 - i]
        elif len(history) >= min_length:
            # no match: the context's last window has no occurrence with a follower
            window = history[-min_length:]
            assert not any(content[j : j + min_length] == window
                           for j in range(len(content) - min_length))


def test_the_session_source_never_matches_the_current_context() -> None:
    source = SessionSource(2)
    model = MatchModel(source, 2)
    tokens = [1, 2, 3, 1, 2, 4, 1, 2]
    predicted = []
    for token in tokens:
        prediction = model.prediction()
        predicted.append(None if prediction is None else prediction.token)
        source.append(token)
        model.update(source.tokens, token)
        assert model.pointer < len(source.tokens)  # a token the session already holds
    # after the second "1 2" the session predicts 3, after the third it predicts 4 (newest)
    assert predicted[5] == 3
    assert model.prediction() is not None and model.prediction().token == 4  # type: ignore[union-attr]


@given(st.lists(st.integers(0, 4), min_size=3, max_size=200))
def test_top_followers_match_brute_force_counts(content: list[int]) -> None:
    index = _index(content)
    followers: dict[tuple[int, int], Counter[int]] = {}
    for a, b, c in zip(content, content[1:], content[2:], strict=False):
        followers.setdefault((a, b), Counter())[c] += 1
    for a in range(5):
        for b in range(5):
            found = index.top_follower(a, b)
            counts = followers.get((a, b))
            if counts is None:
                assert found is None
                continue
            assert found is not None
            token, count, total = found
            best = max(counts.values())
            assert (count, total) == (best, sum(counts.values()))
            assert token == min(t for t, n in counts.items() if n == best)


def test_the_ngram_predictor_names_the_top_follower() -> None:
    ngram = DictionaryNgram(_index([1, 2, 3, 1, 2, 3, 1, 2, 4]))
    ngram.update([1], 1)
    assert ngram.prediction() is None
    ngram.update([1, 2], 2)
    prediction = ngram.prediction()
    assert prediction is not None and prediction.token == 3


def test_confidence_moves_toward_outcomes_and_stays_inside_the_total() -> None:
    confidence = Confidence()
    start = confidence.probability[5]
    confidence.update(5, True)
    assert confidence.probability[5] > start
    for _ in range(2000):
        confidence.update(5, False)
    assert 0 < confidence.probability[5] < TOTAL // 100
    for _ in range(2000):
        confidence.update(5, True)
    assert TOTAL - TOTAL // 100 < confidence.probability[5] < TOTAL

"""The trie metric d_T: what holds (hypothesis), what the paper claims that does not, and
nearest-session queries against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.trie import Namespace, PrefixTrie, prefix_probability, trie_distance
from seqkv.trie.errors import TrieConfigError

sequences = st.lists(st.integers(0, 3), min_size=0, max_size=7).map(tuple)
nonempty = st.lists(st.integers(0, 3), min_size=1, max_size=7).map(tuple)


def log2_probs(tokens: tuple[int, ...]) -> list[float]:
    """A function of the prefix only; multiples of 1/4, so sums are exact in float."""
    return [-(1 + (3 * (tokens[i - 1] if i else 2) + t) % 5) / 4 for i, t in enumerate(tokens)]


def d(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    return trie_distance(a, log2_probs(a), b)


def u(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    return prefix_probability(a, log2_probs(a), b)


@given(sequences, sequences)
def test_symmetric(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    assert d(a, b) == d(b, a)


@given(nonempty)
def test_self_distance_is_the_surprisal_and_not_zero(s: tuple[int, ...]) -> None:
    assert d(s, s) == -sum(log2_probs(s))
    assert d(s, s) > 0


@given(sequences, sequences, sequences)
def test_reversed_three_point_condition(
    a: tuple[int, ...], b: tuple[int, ...], c: tuple[int, ...]
) -> None:
    assert d(a, c) >= min(d(a, b), d(b, c))
    smallest, middle, _ = sorted([d(a, b), d(b, c), d(a, c)])
    assert smallest == middle  # of three sequences, two pairs share the shortest common prefix


@given(sequences, sequences, sequences)
def test_two_to_the_minus_d_is_an_ultrametric(
    a: tuple[int, ...], b: tuple[int, ...], c: tuple[int, ...]
) -> None:
    assert u(a, c) <= max(u(a, b), u(b, c))


@given(nonempty, nonempty)
def test_the_papers_ultrametric_inequality_fails_on_every_disjoint_pair(
    s: tuple[int, ...], other: tuple[int, ...]
) -> None:
    other = ((s[0] + 1) % 4, *other[1:])  # shares no first token with s
    assert d(s, s) > max(d(s, other), d(other, s))


def test_the_papers_ultrametric_inequality_fails_on_three_distinct_sequences() -> None:
    s, s1, s2 = (1, 2), (3,), (1, 0)
    assert d(s, s2) > max(d(s, s1), d(s1, s2)) == 0.0


@given(st.lists(nonempty, min_size=1, max_size=6), nonempty)
def test_trie_distance_between_sessions_matches_the_function(
    stored: list[tuple[int, ...]], extra: tuple[int, ...]
) -> None:
    trie = PrefixTrie()
    sessions = [trie.insert(s, log2_probs(s)).session for s in [*stored, extra]]
    for i, a in enumerate([*stored, extra]):
        for j, b in enumerate([*stored, extra]):
            got = trie.distance(sessions[i], sessions[j])  # type: ignore[arg-type]
            assert got == pytest.approx(d(a, b), abs=1e-12)


@given(st.lists(nonempty, min_size=1, max_size=6), sequences)
def test_nearest_sessions_against_brute_force(
    stored: list[tuple[int, ...]], query: tuple[int, ...]
) -> None:
    trie = PrefixTrie()
    sessions = {trie.insert(s, log2_probs(s)).session: s for s in stored}
    before = trie.nodes()
    ranked = trie.nearest_sessions(query)
    assert trie.nodes() == before  # mutates nothing: no split, no statistics
    assert len(ranked) == len(stored)
    for neighbor in ranked:
        session = sessions[neighbor.session]
        assert neighbor.distance_bits == pytest.approx(d(query, session) if query else 0.0)
        assert neighbor.session_tokens == len(session)
    distances = [n.distance_bits for n in ranked]
    assert distances == sorted(distances, reverse=True)


def test_nearest_is_the_largest_distance() -> None:
    trie = PrefixTrie()
    near = trie.insert([1, 2, 3, 4], [-1.0] * 4).session
    far = trie.insert([1, 9], [-1.0] * 2).session
    other = trie.insert([7], [-1.0]).session
    ranked = trie.nearest_sessions([1, 2, 3, 5], k=2)
    assert [n.session for n in ranked] == [near, far]
    assert [n.distance_bits for n in ranked] == [3.0, 1.0]
    assert other not in [n.session for n in ranked]


def test_nearest_sessions_stay_in_their_namespace() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2], [-1.0, -1.0], namespace=Namespace("a"))
    assert trie.nearest_sessions([1, 2], namespace=Namespace("b")) == ()


def test_nearest_with_negative_k() -> None:
    with pytest.raises(TrieConfigError, match="k must be"):
        PrefixTrie().nearest_sessions([1], k=-1)

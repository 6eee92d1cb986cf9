"""Clusters by d_T >= delta against pairwise brute force; the corollary against the bytes stored."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import EmptyInputError
from seqkv.proofs import relative_storage_float, relative_storage_with_prefix
from seqkv.trie import (
    PrefixTrie,
    ScoredSequence,
    cluster_sessions,
    cluster_trie_sessions,
    trie_distance,
)
from seqkv.trie.errors import TrieConfigError

tokens = st.lists(st.integers(0, 2), min_size=1, max_size=6).map(tuple)
thresholds = st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0, 100.0])


def log2_probs(seq: tuple[int, ...]) -> list[float]:
    """A function of the prefix only; multiples of 1/2, so sums are exact."""
    return [-((2 * (seq[i - 1] if i else 1) + t) % 3) / 2 for i, t in enumerate(seq)]


def scored(seq: tuple[int, ...]) -> ScoredSequence:
    return ScoredSequence.of(seq, log2_probs(seq))


@given(st.lists(tokens, min_size=1, max_size=8), thresholds)
def test_clusters_are_the_classes_of_d_at_least_delta(
    seqs: list[tuple[int, ...]], delta: float
) -> None:
    report = cluster_sessions([scored(s) for s in seqs], delta)
    cluster_of = {m: i for i, c in enumerate(report.clusters) for m in c.members}
    for i, a in enumerate(seqs):
        for j, b in enumerate(seqs):
            if i == j:
                continue
            related = trie_distance(a, log2_probs(a), b) >= delta
            same = i in cluster_of and cluster_of.get(i) == cluster_of.get(j)
            assert related == same, (a, b)


@given(st.lists(tokens, min_size=1, max_size=8), thresholds)
def test_storage_accounting(seqs: list[tuple[int, ...]], delta: float) -> None:
    report = cluster_sessions([scored(s) for s in seqs], delta)
    assert report.positions_clustered <= report.positions_naive
    n, f, tail = report.mean_length, report.clustered_fraction, report.mean_tail_length
    clustered = [len(seqs[m]) for c in report.clusters for m in c.members]
    n_c = sum(clustered) / len(clustered) if clustered else 0.0
    exact = 1 - f * (n_c - tail) / n + (report.storage_predicted_with_prefix
                                        - report.storage_predicted)
    assert report.storage_measured == pytest.approx(exact)


@given(st.lists(st.lists(st.integers(0, 2), min_size=5, max_size=5).map(tuple), min_size=2,
                max_size=8), thresholds)
def test_with_equal_lengths_the_corrected_corollary_is_exact(
    seqs: list[tuple[int, ...]], delta: float
) -> None:
    report = cluster_sessions([scored(s) for s in seqs], delta)
    assert report.storage_predicted_with_prefix == pytest.approx(report.storage_measured)
    assert report.storage_predicted <= report.storage_measured + 1e-12


def test_the_prediction_agrees_with_the_symbolic_corollary() -> None:
    seqs = [(0, 1, 2, 0), (0, 1, 2, 1), (0, 1, 0, 0), (2, 2, 2, 2)]
    report = cluster_sessions([scored(s) for s in seqs], 0.5)
    assert len(report.clusters) == 1 and report.clusters[0].shared_length == 2
    f, tail, n = report.clustered_fraction, report.mean_tail_length, report.mean_length
    assert report.storage_predicted == pytest.approx(relative_storage_float(f, tail, n))
    with_prefix = relative_storage_with_prefix(
        f, tail, n, clusters=1, prefix_length=2, sessions=4)
    assert report.storage_predicted_with_prefix == pytest.approx(float(with_prefix))
    assert report.storage_measured == pytest.approx((16 - 2 * 2) / 16)


def test_paraphrases_share_only_up_to_the_divergence() -> None:
    you, are, a, helpful, an, ai, assistant = range(7)
    first = (you, are, a, helpful, assistant)
    second = (you, are, an, ai, assistant)
    report = cluster_sessions([ScoredSequence.of(first, [-3.0] * 5),
                               ScoredSequence.of(second, [-3.0] * 5)], 5.0)
    assert [c.shared_length for c in report.clusters] == [2]  # "You are", nothing after
    assert report.positions_clustered == 10 - 2


def test_threshold_zero_puts_everything_in_one_cluster() -> None:
    report = cluster_sessions([scored((0, 1)), scored((2, 2)), scored((1,))], 0.0)
    assert [c.members for c in report.clusters] == [(0, 1, 2)]
    assert report.clusters[0].shared_length == 0
    assert report.storage_measured == 1.0


def test_sessions_below_the_threshold_are_related_to_nothing() -> None:
    low = ScoredSequence.of((1, 2), [-0.5, -0.5])
    report = cluster_sessions([low, low], 5.0)
    assert report.clusters == ()
    assert report.clustered_fraction == 0.0
    assert report.storage_predicted == 1.0


def test_clusters_of_a_tries_live_sessions() -> None:
    trie = PrefixTrie()
    for seq in [(0, 1, 2), (0, 1, 1), (2, 2)]:
        trie.insert(seq, log2_probs(seq))
    report = cluster_trie_sessions(trie, 0.5)
    assert [c.shared_length for c in report.clusters] == [2]


def test_empty_input() -> None:
    with pytest.raises(EmptyInputError, match="at least one session"):
        cluster_sessions([], 1.0)


@pytest.mark.parametrize("threshold", [-1.0, math.nan, math.inf])
def test_bad_threshold(threshold: float) -> None:
    with pytest.raises(TrieConfigError, match="threshold_bits"):
        cluster_sessions([scored((1,))], threshold)


def test_sessions_without_tokens() -> None:
    with pytest.raises(EmptyInputError, match="holding tokens"):
        cluster_sessions([ScoredSequence.of([], [])], 1.0)

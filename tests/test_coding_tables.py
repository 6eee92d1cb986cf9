"""The model-free levels' tables in their sparse and dense forms (``seqkv.coding.tables``,
``seqkv.coding.ngram``): every share and every located target equal the reference dense
cumulative array's, on both of ``NgramTable``'s representations, and the coders produce the bits
they produced under the reference tables."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.coding import ngram
from seqkv.coding.arithmetic import OVERRUN_BITS, ArithmeticDecoder, ArithmeticEncoder
from seqkv.coding.frequencies import (
    TOTAL_FREQUENCY,
    symbol_cost_bits,
    uniform_cumulative,
    uniform_distribution,
)
from seqkv.coding.ngram import AdaptiveNgram, NgramTable
from seqkv.coding.tables import DenseTable, PositionTable, UniformPredictor, cost_bits
from seqkv.levels import NgramLevel, PlainLevel
from seqkv.levels.base import TraceColumns
from seqkv.levels.model_free import ModelFreeLevel, code_tokens, decode_tokens


def _targets(cumulative: np.ndarray, rng: np.random.Generator) -> list[int]:
    """Every share's first and last target (at most 300 shares), and random ones."""
    shares = range(cumulative.shape[0] - 1)
    if len(shares) > 300:
        shares = sorted(int(s) for s in rng.choice(len(shares), 300, replace=False))
    ends = [int(cumulative[s]) for s in shares] + [int(cumulative[s + 1]) - 1 for s in shares]
    return ends + [int(t) for t in rng.integers(0, TOTAL_FREQUENCY, 50)]


def assert_same_table(table: PositionTable, cumulative: np.ndarray, log2p: np.ndarray,
                      rng: np.random.Generator) -> None:
    vocab = cumulative.shape[0] - 1
    symbols = range(vocab) if vocab <= 300 else [int(s) for s in rng.integers(0, vocab, 300)]
    for symbol in symbols:
        assert table.interval(symbol) == (int(cumulative[symbol]), int(cumulative[symbol + 1]))
    for target in _targets(cumulative, rng):
        symbol = int(np.searchsorted(cumulative, target, side="right")) - 1
        assert table.locate(target) == (symbol, int(cumulative[symbol]),
                                        int(cumulative[symbol + 1]))
    symbol = int(rng.integers(0, vocab))
    assert table.surprisal(symbol) == pytest.approx(-log2p[symbol], rel=1e-12, abs=1e-12)
    entropy = -float((np.exp2(log2p) * log2p).sum())
    assert table.entropy() == pytest.approx(entropy, rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError, match="outside"):
        table.interval(vocab)
    with pytest.raises(ValueError, match="outside"):
        table.interval(-1)


histories = st.tuples(st.sampled_from([2, 3, 7, 300, 5000]), st.integers(0, 2**32 - 1),
                      st.integers(0, 250), st.sampled_from([0.2, 1.0, 5.0]))


@given(histories, st.sampled_from([64, 0]))
def test_ngram_tables_are_the_reference_tables(case: tuple[int, int, int, float],
                                               small_seen: int) -> None:
    """Invariant 2 of ``seqkv.coding.ngram``: at every position of a random history, the sparse
    table (Python integers up to ``SMALL_SEEN`` tokens seen; with 0, numpy arrays from the
    first token) gives each token the reference table's share."""
    vocab, seed, length, concentration = case
    rng = np.random.default_rng(seed)
    tokens = rng.choice(vocab, length, p=rng.dirichlet(np.full(vocab, concentration)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ngram, "SMALL_SEEN", small_seen)
        model = AdaptiveNgram(vocab)
        for position in range(length + 1):
            if position % 17 == 0 or position == length:
                table = model.table()
                assert isinstance(table.symbols, list) == (
                    len(set(tokens[:position].tolist())) <= small_seen)
                assert_same_table(table, *model.distribution(), rng)
            if position < length:
                model.update(int(tokens[position]))


def test_the_representations_switch_at_small_seen() -> None:
    model = AdaptiveNgram(1000)
    for token in range(ngram.SMALL_SEEN):
        model.update(token)
    assert isinstance(model.table().symbols, list)
    model.update(ngram.SMALL_SEEN)
    assert isinstance(model.table().symbols, np.ndarray)
    assert_same_table(model.table(), *model.distribution(), np.random.default_rng(0))


def test_a_table_past_its_history_limit_is_refused_as_the_reference_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights must sum below 2**30 (``cumulative_from_counts``): the sparse table refuses
    what the reference refuses."""
    monkeypatch.setattr(ngram, "_MAX_TOTAL", 1 << 12)
    model = AdaptiveNgram(4)
    model.update(1)
    assert model.table().total == 4 - 1 + 9
    for _ in range(200):
        model.update(1)
    with pytest.raises(ValueError, match="not below 2"):
        model.table()


def test_a_dense_table_is_its_cumulative_array() -> None:
    predictor = UniformPredictor(37)
    table = predictor.table()
    assert isinstance(table, DenseTable)
    assert_same_table(table, *uniform_distribution(37), np.random.default_rng(1))
    predictor.update(5)
    assert predictor.table() is table


@pytest.mark.parametrize("level", [NgramLevel(), PlainLevel()])
@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 5, 512]), st.integers(1, 200),
       st.integers(0, 12))
def test_the_coders_write_the_bits_of_the_reference_tables(
        level: ModelFreeLevel, seed: int, vocab: int, length: int, prefix_length: int) -> None:
    """``code_tokens`` under the level's tables writes exactly what encoding under the dense
    reference tables writes (no coded figure moves), and ``decode_tokens`` returns the tokens;
    the per-position cost is the reference table's."""
    rng = np.random.default_rng(seed)
    prefix = [int(t) for t in rng.integers(0, vocab, prefix_length)]
    tokens = [int(t) for t in rng.integers(0, vocab, length)]
    encoder = ArithmeticEncoder()
    trace = TraceColumns()
    code_tokens(level, vocab, prefix, tokens, encoder, trace)
    code = encoder.finish()
    reference = ArithmeticEncoder()
    model = AdaptiveNgram(vocab)
    for token in prefix:
        model.update(token)
    costs = []
    for token in tokens:
        cumulative = (model.distribution()[0] if isinstance(level, NgramLevel)
                      else uniform_cumulative(vocab))
        reference.encode(cumulative, token)
        costs.append(symbol_cost_bits(cumulative, token))
        model.update(token)
    assert code == reference.finish()
    assert trace.cost == pytest.approx(costs, rel=1e-12)
    decoded = decode_tokens(level, vocab, prefix, length, ArithmeticDecoder(code, OVERRUN_BITS),
                            TraceColumns())
    assert decoded == tokens


def test_cost_bits_is_the_share_cost() -> None:
    assert cost_bits(0, 1 << 31) == 1.0
    assert cost_bits(5, 5 + (1 << 22)) == 10.0


def test_an_ngram_table_has_no_dict() -> None:
    """Built once a position: slotted, as the trie's nodes are."""
    assert not hasattr(AdaptiveNgram(3).table(), "__dict__")
    assert NgramTable.__slots__

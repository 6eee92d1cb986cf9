"""The token coder: exact round trips and exact code lengths, against the quantized tables."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder, BitStream
from seqkv.coding.frequencies import (
    TOTAL_FREQUENCY,
    cumulative_from_logits,
    cumulative_from_probabilities,
    log_softmax_bits,
    symbol_cost_bits,
    table_and_log2p,
    uniform_cumulative,
)


@st.composite
def coded_streams(draw: st.DrawFn) -> tuple[list[np.ndarray], list[int]]:
    vocab = draw(st.integers(1, 300))
    length = draw(st.integers(0, 60))
    seed = draw(st.integers(0, 2**32 - 1))
    sharpness = draw(st.sampled_from([0.1, 1.0, 5.0, 30.0]))
    rng = np.random.default_rng(seed)
    tables = [cumulative_from_logits(rng.standard_normal(vocab) * sharpness)
              for _ in range(length)]
    # Symbols drawn from the table itself, plus a few deliberately improbable ones.
    symbols = [
        int(np.searchsorted(t, rng.integers(0, TOTAL_FREQUENCY), side="right") - 1)
        if rng.random() < 0.8 else int(rng.integers(0, vocab))
        for t in tables
    ]
    return tables, symbols


@given(coded_streams())
def test_round_trip_and_exact_length_bound(stream: tuple[list[np.ndarray], list[int]]) -> None:
    tables, symbols = stream
    encoder = ArithmeticEncoder()
    for table, symbol in zip(tables, symbols, strict=True):
        encoder.encode(table, symbol)
    code = encoder.finish()
    decoder = ArithmeticDecoder(code)
    assert [decoder.decode(table) for table in tables] == symbols
    ideal = sum(symbol_cost_bits(t, s) for t, s in zip(tables, symbols, strict=True))
    assert code.num_bits <= ideal + 2 + 1e-6 * len(symbols)
    assert len(code.data) == (code.num_bits + 7) // 8


def test_empty_stream_costs_at_most_the_flush() -> None:
    assert ArithmeticEncoder().finish().num_bits <= 2


def test_certain_symbols_cost_almost_nothing() -> None:
    table = cumulative_from_probabilities(np.array([1.0, 0.0, 0.0]))
    encoder = ArithmeticEncoder()
    for _ in range(1000):
        encoder.encode(table, 0)
    assert encoder.finish().num_bits <= 2


def test_tables_are_exact_and_cost_at_most_the_quantization_bound() -> None:
    rng = np.random.default_rng(7)
    logits = rng.standard_normal(49_152).astype(np.float32) * 6
    table = cumulative_from_logits(logits)
    counts = np.diff(table)
    assert table[0] == 0 and table[-1] == TOTAL_FREQUENCY and counts.min() >= 1
    log2p = log_softmax_bits(logits)
    loss = -np.log2(1 - 49_152 / TOTAL_FREQUENCY)
    for symbol in rng.integers(0, 49_152, 200):
        assert symbol_cost_bits(table, int(symbol)) <= -log2p[symbol] + loss + 1e-9


def test_uniform_table_costs_log2_vocab() -> None:
    assert symbol_cost_bits(uniform_cumulative(1024), 17) == pytest.approx(10.0, abs=1e-6)


def test_encoder_rejects_symbols_outside_the_table() -> None:
    with pytest.raises(ValueError, match="outside"):
        ArithmeticEncoder().encode(uniform_cumulative(4), 4)


def test_encoder_rejects_encode_after_finish() -> None:
    encoder = ArithmeticEncoder()
    encoder.finish()
    with pytest.raises(RuntimeError):
        encoder.encode(uniform_cumulative(4), 0)


def test_tables_reject_invalid_probabilities() -> None:
    with pytest.raises(ValueError, match="finite"):
        cumulative_from_probabilities(np.array([0.5, np.nan]))


def test_bitstream_rejects_inconsistent_lengths() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        BitStream(b"\x00\x00", 3)


def test_one_pass_table_and_log2p_equal_the_separate_functions() -> None:
    logits = np.random.default_rng(11).standard_normal(5000).astype(np.float32) * 7
    table, log2p = table_and_log2p(logits)
    assert np.array_equal(table, cumulative_from_logits(logits))
    assert np.array_equal(log2p, log_softmax_bits(logits))

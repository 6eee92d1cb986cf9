"""The token coder: exact round trips and exact code lengths, against the quantized tables."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.coding.arithmetic import (
    OVERRUN_BITS,
    ArithmeticDecoder,
    ArithmeticEncoder,
    BitStream,
    _trimmed_length,
)
from seqkv.coding.frequencies import (
    TOTAL_FREQUENCY,
    CumulativeTable,
    cumulative_from_logits,
    cumulative_from_probabilities,
    log_softmax_bits,
    symbol_cost_bits,
    table_and_log2p,
    uniform_cumulative,
)
from seqkv.errors import CodeExhaustedError


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
    decoder = ArithmeticDecoder(code, OVERRUN_BITS)  # the guard never trips on a finished stream
    assert [decoder.decode(table) for table in tables] == symbols
    assert decoder.canonical(floor=True)
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


def _coded(tables: list[CumulativeTable], symbols: list[int]) -> BitStream:
    encoder = ArithmeticEncoder()
    for table, symbol in zip(tables, symbols, strict=True):
        encoder.encode(table, symbol)
    return encoder.finish()


def _bits(code: BitStream) -> list[int]:
    return [int(b) for b in np.unpackbits(np.frombuffer(code.data, np.uint8))[: code.num_bits]]


def _stream(bits: list[int]) -> BitStream:
    return BitStream(np.packbits(np.array(bits, dtype=np.uint8)).tobytes(), len(bits))


@pytest.mark.parametrize("symbol", [0, 255, 511])
def test_runs_of_one_symbol_never_trip_the_guard(symbol: int) -> None:
    """Runs of the lowest, a middle and the highest symbol (the streams whose codes end in long
    runs of equal bits) decode under the guard, and their codes are canonical."""
    table = uniform_cumulative(512)
    code = _coded([table] * 200, [symbol] * 200)
    decoder = ArithmeticDecoder(code, OVERRUN_BITS)
    assert [decoder.decode(table) for _ in range(200)] == [symbol] * 200
    assert decoder.canonical(floor=True)


def test_the_floor_keeps_the_zeros_the_guard_needs() -> None:
    """Trailing zeros are dropped down to ``shifts - OVERRUN_BITS`` bits, not below: a stream
    whose flush ends in a long run of pending zeros keeps enough of them."""
    bits = [1] + [0] * 300
    assert _trimmed_length(bits, shifts=299) == 299 - OVERRUN_BITS
    assert _trimmed_length(bits, shifts=299, floor=False) == 1
    assert _trimmed_length(bits, shifts=10) == 1


def test_a_forged_count_runs_out_of_information() -> None:
    """Three symbols coded, ten thousand asked for: the guard stops the decode once it has read
    OVERRUN_BITS past the code's end (a few symbols of 9 bits), not after 10,000."""
    table = uniform_cumulative(512)
    code = _coded([table] * 3, [5, 17, 3])
    decoder = ArithmeticDecoder(code, OVERRUN_BITS)
    decoded = 0
    with pytest.raises(CodeExhaustedError, match="run out"):
        for _ in range(10_000):
            decoder.decode(table)
            decoded += 1
    assert decoded <= (code.num_bits + OVERRUN_BITS) // 9 + 1
    unguarded = ArithmeticDecoder(code)  # the streams of older writers: no guard
    assert len([unguarded.decode(table) for _ in range(1000)]) == 1000


@pytest.mark.parametrize("change", ["append 0", "append 1", "drop last", "flip last"])
def test_a_changed_code_decoding_alike_is_not_canonical(change: str) -> None:
    rng = np.random.default_rng(7)
    tables = [cumulative_from_logits(rng.standard_normal(64) * 3) for _ in range(40)]
    symbols = [int(rng.integers(0, 64)) for _ in tables]
    bits = _bits(_coded(tables, symbols))
    changed = {"append 0": [*bits, 0], "append 1": [*bits, 1], "drop last": bits[:-1],
               "flip last": [*bits[:-1], 1 - bits[-1]]}[change]
    decoder = ArithmeticDecoder(_stream(changed), OVERRUN_BITS)
    try:
        decoded = [decoder.decode(table) for table in tables]
    except CodeExhaustedError:
        return
    assert decoded != symbols or not decoder.canonical(floor=True)

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
    least_symbol_bits,
    within_code,
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


@st.composite
def forged_streams(draw: st.DrawFn) -> tuple[list[np.ndarray], BitStream]:
    """Tables whose largest count is bounded (at most a share of the total), and any bits."""
    vocab = draw(st.integers(2, 64))
    seed = draw(st.integers(0, 2**32 - 1))
    sharpness = draw(st.sampled_from([0.0, 0.5, 3.0]))
    rng = np.random.default_rng(seed)
    tables = [cumulative_from_logits(rng.standard_normal(vocab) * sharpness)
              for _ in range(draw(st.integers(1, 8)))]
    kind = draw(st.sampled_from(["empty", "zeros", "ones", "random"]))
    length = 0 if kind == "empty" else draw(st.integers(1, 40))
    data = {"empty": b"", "zeros": bytes(length), "ones": b"\xff" * length,
            "random": rng.bytes(length)}[kind]
    return tables, BitStream(data, 8 * len(data) - (draw(st.integers(0, 7)) if data else 0))


def _largest(tables: list[np.ndarray]) -> int:
    return max(int(np.diff(table).max()) for table in tables)


@given(forged_streams())
def test_a_guarded_decoder_produces_no_more_symbols_than_the_code_carries(
        stream: tuple[list[np.ndarray], BitStream]) -> None:
    """Invariant 7: whatever the bits, a guarded decoder cycling through tables whose largest
    count is ``c`` completes ``k`` symbols only while ``within_code(k, least_symbol_bits(c),
    num_bits)``: a count beyond is refused by the guard, so refusing it up front loses
    nothing."""
    tables, code = stream
    _assert_guard_within(tables, code, least_symbol_bits(_largest(tables)))


def _assert_guard_within(tables: list[np.ndarray], code: BitStream, least: float) -> None:
    decoder = ArithmeticDecoder(code, OVERRUN_BITS)
    completed = 0
    with pytest.raises(CodeExhaustedError):
        while True:
            decoder.decode(tables[completed % len(tables)])
            completed += 1
            assert within_code(completed, least, code.num_bits), completed


def test_an_overstated_bound_is_caught() -> None:
    """The property above fails on a bound that would refuse what the guard lets through (a
    9-bit symbol counted as 10 bits: an empty code's 7 symbols would be refused)."""
    tables = [uniform_cumulative(512)]
    _assert_guard_within(tables, BitStream(b"", 0), least_symbol_bits(_largest(tables)))
    with pytest.raises(AssertionError):
        _assert_guard_within(tables, BitStream(b"", 0), 10.0)


@given(coded_streams())
def test_an_honest_stream_is_within_its_code(stream: tuple[list[np.ndarray], list[int]]) -> None:
    tables, symbols = stream
    if not tables:
        return
    encoder = ArithmeticEncoder()
    for table, symbol in zip(tables, symbols, strict=True):
        encoder.encode(table, symbol)
    code = encoder.finish()
    assert within_code(len(symbols), least_symbol_bits(_largest(tables)), code.num_bits)


def test_the_bound_is_near_tight_for_the_uniform_table() -> None:
    """At a uniform table of 512 symbols (9 bits each), an empty code carries at most
    (64 + 2) / 9 symbols: 7 pass, 8 do not; the guard itself stops an empty stream there."""
    least = least_symbol_bits(int(np.diff(uniform_cumulative(512)).max()))
    assert 8.99 < least < 9.0
    assert within_code(7, least, 0) and not within_code(8, least, 0)
    decoder = ArithmeticDecoder(BitStream(b"", 0), OVERRUN_BITS)
    with pytest.raises(CodeExhaustedError):
        for _ in range(8):
            decoder.decode(uniform_cumulative(512))


def test_a_count_near_the_total_bounds_nothing() -> None:
    """A table that may give one symbol all but 1 count per other symbol (the ngram level's, a
    model's): a symbol may take almost no bits, so no count is refused by the bound."""
    least = least_symbol_bits(TOTAL_FREQUENCY - 1)
    assert 0 <= least < 1e-9
    assert within_code(1 << 31, least, 0)
    with pytest.raises(ValueError, match="count"):
        least_symbol_bits(0)


def test_target_and_consume_are_decode() -> None:
    """``decode`` is ``target`` located in the table, then ``consume`` of its share."""
    table = cumulative_from_probabilities(np.array([0.5, 0.25, 0.125, 0.125]))
    encoder = ArithmeticEncoder()
    for symbol in (3, 0, 2, 2, 1):
        encoder.encode_interval(int(table[symbol]), int(table[symbol + 1]))
    code = encoder.finish()
    one, other = ArithmeticDecoder(code, OVERRUN_BITS), ArithmeticDecoder(code, OVERRUN_BITS)
    for _ in range(5):
        target = other.target()
        symbol = int(np.searchsorted(table, target, side="right")) - 1
        other.consume(int(table[symbol]), int(table[symbol + 1]))
        assert one.decode(table) == symbol
    with pytest.raises(ValueError, match="share"):
        ArithmeticEncoder().encode_interval(5, 5)


class _BitByBitDecoder:
    """The decoder's renormalisation one shift at a time, as ``ArithmeticEncoder`` does it: the
    reference the decoder's runs of shifts are checked against."""

    def __init__(self, stream: BitStream, overrun_bits: int | None) -> None:
        self.bits = np.unpackbits(np.frombuffer(stream.data, dtype=np.uint8))[: stream.num_bits]
        self.limit = None if overrun_bits is None else stream.num_bits + overrun_bits
        self.position, self.low, self.high, self.pending = 0, 0, (1 << 64) - 1, 0
        self.emitted: list[int] = []
        self.value = 0
        for _ in range(64):
            self.value = (self.value << 1) | self.next_bit(check=False)

    def next_bit(self, check: bool = True) -> int:
        position = self.position
        self.position += 1
        if check and self.limit is not None and position - 64 >= self.limit:
            raise CodeExhaustedError("run out")
        return int(self.bits[position]) if position < self.bits.shape[0] else 0

    def emit(self, bit: int) -> None:
        self.emitted += [bit] + [1 - bit] * self.pending
        self.pending = 0

    def finished(self, floor: bool) -> list[int]:
        flush = 0 if self.low < 1 << 62 else 1
        bits = [*self.emitted, flush, *[1 - flush] * (self.pending + 1)]
        length = _trimmed_length(bits, self.position - 64, floor)
        return bits[:length] + [0] * max(0, length - len(bits))

    def decode(self, table: np.ndarray) -> int:
        width = self.high - self.low + 1
        target = (((self.value - self.low + 1) << 32) - 1) // width
        symbol = int(np.searchsorted(table, target, side="right")) - 1
        self.high = self.low + ((width * int(table[symbol + 1])) >> 32) - 1
        self.low = self.low + ((width * int(table[symbol])) >> 32)
        half, quarter = 1 << 63, 1 << 62
        while True:
            if self.high < half:
                self.emit(0)
            elif self.low >= half:
                self.emit(1)
                self.low, self.high, self.value = (self.low - half, self.high - half,
                                                   self.value - half)
            elif self.low >= quarter and self.high < half + quarter:
                self.pending += 1
                self.low, self.high, self.value = (self.low - quarter, self.high - quarter,
                                                   self.value - quarter)
            else:
                return symbol
            self.low <<= 1
            self.high = (self.high << 1) | 1
            self.value = (self.value << 1) | self.next_bit()


@given(forged_streams(), st.sampled_from([None, OVERRUN_BITS, 0]), st.booleans())
def test_the_runs_of_shifts_are_the_shifts_one_at_a_time(
        stream: tuple[list[np.ndarray], BitStream], overrun: int | None, skewed: bool) -> None:
    """``ArithmeticDecoder.consume`` takes its shifts a run at a time: over any bits and tables
    (skewed ones, whose likely symbols take next to no bits, included), it decodes the symbols,
    reads the bits, trips the guard at the symbol and leaves the state (interval, value,
    pending and emitted bits, canonical verdicts) that shifting one bit at a time does."""
    tables, code = stream
    if skewed:
        tables = [cumulative_from_probabilities(np.array([1e9, 1.0, 1.0])), *tables]
    decoder, reference = ArithmeticDecoder(code, overrun), _BitByBitDecoder(code, overrun)
    for step in range(300):
        table = tables[step % len(tables)]
        try:
            expected = reference.decode(table)
        except CodeExhaustedError:
            with pytest.raises(CodeExhaustedError):
                decoder.decode(table)
            return
        assert decoder.decode(table) == expected
        assert (decoder._low, decoder._high, decoder._value, decoder._pending,
                decoder._position) == (reference.low, reference.high, reference.value,
                                       reference.pending, reference.position)
        for floor in (True, False):
            assert decoder._finished_bits(floor) == reference.finished(floor)

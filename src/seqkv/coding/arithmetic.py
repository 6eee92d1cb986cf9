"""An exact binary arithmetic coder over fixed-point frequency tables, for the token stream.

NOTE: seqkv codes KV residuals with constriction, but not the tokens. Measured here (500 tokens,
49,152-symbol categoricals, 20 streams): constriction's range coder ends its stream on a 32-bit word
boundary and spent 5 to 32 bits (17 on average) over the ideal per stream, ~0.55% of a
3,000-bit stream; real text at 3.5 bits/token over 512 tokens is ~1,800 bits, so that alone
misses the 0.5% target. This coder ends on a bit boundary with at most 2 bits of flush, and its
per-symbol cost is bounded by ``frequencies.py``'s quantization (~1.7e-5 bits/token). Its speed is
irrelevant here: each token costs a model forward step, orders of magnitude more than the coder.

The coder is the classic interval-halving scheme with pending ("follow") bits (Witten, Neal and
Cleary, 1987) on 64-bit integer bounds, written with Python integers so no step can overflow.

Invariants:
1. After each symbol the interval [low, high] satisfies ``high - low + 1 > 2**62`` and therefore
   exceeds TOTAL_FREQUENCY = 2**32: every symbol with count >= 1 keeps a non-empty sub-interval
   (enforced by the renormalisation loop).
2. ``finish`` emits at most ``pending + 2`` bits, then drops trailing zero bits, but never below
   ``shifts - OVERRUN_BITS`` bits (``shifts``: the renormalising shifts of the whole stream, one
   per bit the decoder reads past its first 64): the decoder reads zeros past the end of the
   stream, so the dropped bits carry no information (enforced; round-trip tested).
3. The code length is at most the sum of ``-log2(count / total)`` plus 2 bits plus a floor
   rounding term below 1e-9 bits per symbol (checked by the property tests), except where the
   floor of invariant 2 keeps zeros: then it is below that sum.
4. The decoder returns some symbol for any bit string; it cannot tell a wrong stream from a right
   one. Callers verify a checksum of the decoded symbols (``seqkv.codec`` does).
5. Information guard: a decoder given ``overrun_bits`` raises ``CodeExhaustedError`` once it has
   shifted more than ``num_bits + overrun_bits`` times, i.e. once the information it has decoded
   (the sum of ``-log2 p`` of its symbols, to within the 64-bit window) exceeds what the code
   can carry. A stream ``finish`` wrote with the same ``OVERRUN_BITS`` never trips it (invariant
   2); a stream whose writer dropped every trailing zero (seqkv before .skv format 5, the store's
   spans) can, so callers pass ``overrun_bits`` only for streams written with the floor
   (enforced; ``tests/test_coding_arithmetic.py``). It bounds the work a forged symbol count
   buys to about ``num_bits + OVERRUN_BITS`` bits of decoded information.
6. ``canonical`` is True exactly when the stream's bits are the ones ``finish`` writes for the
   symbols decoded so far (with or without the floor): re-encoding is mirrored as the decoder
   runs, so no second pass is needed (enforced; a bit appended, dropped or changed is refused).
   ``canonical_bytes`` is the same at whole bytes, for writers that keep no bit length.
7. Information bound: while the interval is wider than ``2**62`` (invariant 1) a symbol of
   count ``c`` narrows it by a factor below ``c / TOTAL_FREQUENCY + 2**-62``, and each shift
   doubles it back, so a decoder that has produced ``k`` symbols has shifted more than
   ``k * b - 2`` times, ``b`` the least of ``-log2(c / TOTAL_FREQUENCY + 2**-62)`` over their
   counts. A guarded decoder (invariant 5) of ``num_bits`` bits therefore cannot produce
   ``count`` symbols whose every count is at most ``largest`` once
   ``count * least_symbol_bits(largest) > num_bits + overrun_bits + 2``: ``within_code``
   says so before any symbol is decoded, and a caller may refuse such a count up front, as the
   guard would refuse it later (checked: ``tests/test_coding_arithmetic.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from seqkv.coding.frequencies import FREQUENCY_BITS, TOTAL_FREQUENCY, CumulativeTable
from seqkv.errors import CodeExhaustedError

_STATE_BITS = 64
_FULL = (1 << _STATE_BITS) - 1
_HALF = 1 << (_STATE_BITS - 1)
_QUARTER = 1 << (_STATE_BITS - 2)
_THREE_QUARTERS = _HALF + _QUARTER
# NOTE: the slack of the information guard (invariant 5), in bits: a forged symbol count costs at
# most this much decoded information past the code's end (a few dozen tokens at the model-coded
# levels), and the floor it puts on ``finish`` keeps zeros only in a stream whose last 64 coded
# bits are all zeros (a long run of the lowest symbol at its end, ~1 file in 2**64 otherwise).
OVERRUN_BITS = 64


@dataclass(frozen=True, slots=True)
class BitStream:
    """A coded bit string: ``num_bits`` bits, most significant bit of ``data[0]`` first."""

    data: bytes
    num_bits: int

    def __post_init__(self) -> None:
        if self.num_bits < 0 or (self.num_bits + 7) // 8 != len(self.data):
            raise ValueError(f"{len(self.data)} bytes cannot hold exactly {self.num_bits} bits")


class ArithmeticEncoder:
    """Encodes symbols one at a time, each under its own cumulative frequency table."""

    def __init__(self) -> None:
        self._low = 0
        self._high = _FULL
        self._pending = 0
        self._bits: list[int] = []
        self._finished = False
        self._shifts = 0

    def encode(self, cumulative: CumulativeTable, symbol: int) -> None:
        """Narrow the interval to ``symbol``'s share of ``cumulative``."""
        if not 0 <= symbol < cumulative.shape[0] - 1:
            raise ValueError(f"symbol {symbol} outside a table of {cumulative.shape[0] - 1}")
        start, end = int(cumulative[symbol]), int(cumulative[symbol + 1])
        if end <= start:
            raise ValueError(f"symbol {symbol} has zero frequency")
        self.encode_interval(start, end)

    def encode_interval(self, start: int, end: int) -> None:
        """Narrow the interval to the share ``[start, end)`` of ``TOTAL_FREQUENCY``: a symbol's
        counts, for tables kept in another form than a cumulative array."""
        if self._finished:
            raise RuntimeError("encode() after finish()")
        if not 0 <= start < end <= TOTAL_FREQUENCY:
            raise ValueError(f"[{start}, {end}) is no symbol's share of {TOTAL_FREQUENCY}")
        width = self._high - self._low + 1
        self._high = self._low + ((width * end) >> FREQUENCY_BITS) - 1
        self._low = self._low + ((width * start) >> FREQUENCY_BITS)
        self._renormalise()

    def _emit(self, bit: int) -> None:
        self._bits.append(bit)
        self._bits.extend([1 - bit] * self._pending)
        self._pending = 0

    def _renormalise(self) -> None:
        while True:
            if self._high < _HALF:
                self._emit(0)
            elif self._low >= _HALF:
                self._emit(1)
                self._low -= _HALF
                self._high -= _HALF
            elif self._low >= _QUARTER and self._high < _THREE_QUARTERS:
                self._pending += 1
                self._low -= _QUARTER
                self._high -= _QUARTER
            else:
                return
            self._shifts += 1
            self._low <<= 1
            self._high = (self._high << 1) | 1

    def finish(self) -> BitStream:
        """Flush the interval and return the bit string; the encoder takes no more symbols."""
        if not self._finished:
            self._finished = True
            self._pending += 1
            self._emit(0 if self._low < _QUARTER else 1)
            del self._bits[_trimmed_length(self._bits, self._shifts):]
        bits = np.array(self._bits, dtype=np.uint8)
        return BitStream(np.packbits(bits).tobytes(), len(self._bits))


def _trimmed_length(bits: list[int], shifts: int, floor: bool = True) -> int:
    """The length of ``bits`` without its trailing zeros, but (``floor``) at least
    ``shifts - OVERRUN_BITS`` (invariant 2)."""
    length = len(bits)
    while length and bits[length - 1] == 0:
        length -= 1
    return max(length, shifts - OVERRUN_BITS) if floor else length


class ArithmeticDecoder:
    """Decodes symbols in the order they were encoded, given the same tables."""

    def __init__(self, stream: BitStream, overrun_bits: int | None = None) -> None:
        # the code's bytes with every bit past ``num_bits`` zero (the only copy kept): read a
        # run of bits at a time
        self._data = np.packbits(self._stream_bits(stream.data, stream.num_bits)).tobytes()
        self._num_bits = stream.num_bits
        self._position = 0  # bits read: the first 64, then one a shift
        self._low = 0
        self._high = _FULL
        # NOTE: the guard counts shifts (bits read past the first 64 of the window); None: off
        self._shift_limit = None if overrun_bits is None else stream.num_bits + overrun_bits
        # the bits ``ArithmeticEncoder`` emitted for the symbols so far (invariant 6), as runs
        # (value, length): each run's bits, most significant first
        self._emitted: list[tuple[int, int]] = []
        self._pending = 0
        self._value = self._read(0, _STATE_BITS)
        self._position = _STATE_BITS

    @staticmethod
    def _stream_bits(data: bytes, num_bits: int) -> npt.NDArray[np.uint8]:
        return np.unpackbits(np.frombuffer(data, dtype=np.uint8))[:num_bits]

    def _read(self, position: int, count: int) -> int:
        """The ``count`` bits at ``position`` as an integer, zeros past the code's end."""
        if position >= self._num_bits or not count:
            return 0
        end = position + count
        first, last = position >> 3, (end + 7) >> 3
        chunk = int.from_bytes(self._data[first:last], "big")
        chunk <<= 8 * (last - first - len(self._data[first:last]))  # zeros past the data
        return (chunk >> (8 * last - end)) & ((1 << count) - 1)

    def _exhausted(self) -> CodeExhaustedError:
        return CodeExhaustedError(
            f"the token code of {self._num_bits:,} bits has run out: decoding on would "
            f"take more than {self._shift_limit:,} bits of information from it, which no "
            "honest stream does (a forged token count, a damaged code, or probabilities this "
            "machine does not reproduce)")

    def _finished_bits(self, floor: bool) -> list[int]:
        """The bits ``ArithmeticEncoder.finish`` writes for the symbols decoded so far, with or
        without the floor of invariant 2."""
        emitted = "".join(format(value, f"0{length}b") for value, length in self._emitted
                          if length)
        bits = [*(int(c) for c in emitted), *([0] if self._low < _QUARTER else [1]),
                *([1 if self._low < _QUARTER else 0] * (self._pending + 1))]
        length = _trimmed_length(bits, self._position - _STATE_BITS, floor)
        return bits[:length] + [0] * max(0, length - len(bits))

    def canonical(self, floor: bool) -> bool:
        """Whether the stream is exactly what ``ArithmeticEncoder.finish`` writes for the symbols
        decoded so far: with the floor of invariant 2 (``floor``) or trimmed to its last one bit
        (the writers before it)."""
        bits = self._finished_bits(floor)
        return len(bits) == self._num_bits and bool(np.array_equal(
            np.asarray(bits, dtype=np.uint8), self._stream_bits(self._data, self._num_bits)))

    def canonical_bytes(self) -> bool:
        """Whether the stream's bytes are what a writer of whole bytes (a store span record of
        version 1 or 2, a ``.skv`` file of format 1 or 2) packs from ``finish``'s bits, floored
        or trimmed, zero-padded to a byte: no byte appended or dropped, no bit changed past the
        code's end."""
        stream = self._stream_bits(self._data, 8 * len(self._data))
        for floor in (True, False):
            bits = self._finished_bits(floor)
            bits += [0] * (-len(bits) % 8)
            if len(bits) == stream.shape[0] and bool(
                    np.array_equal(np.asarray(bits, dtype=np.uint8), stream)):
                return True
        return False

    def decode(self, cumulative: CumulativeTable) -> int:
        """The next symbol under ``cumulative``."""
        symbol = int(np.searchsorted(cumulative, self.target(), side="right")) - 1
        self.consume(int(cumulative[symbol]), int(cumulative[symbol + 1]))
        return symbol

    def target(self) -> int:
        """Where the next symbol's share ``[start, end)`` of ``TOTAL_FREQUENCY`` lies: the
        symbol to decode is the one whose share holds this value (then ``consume`` it)."""
        width = self._high - self._low + 1
        target = (((self._value - self._low + 1) << FREQUENCY_BITS) - 1) // width
        assert 0 <= target < TOTAL_FREQUENCY, "the value left the interval"
        return target

    def consume(self, start: int, end: int) -> None:
        """Narrow the interval to the decoded symbol's share ``[start, end)`` (the one holding
        ``target()``) and read the bits that frees."""
        # NOTE: ``ArithmeticEncoder._renormalise`` with the value beside it, its shifts taken a
        # run at a time: first the ones that emit a bit (while low and high share their top
        # bit: as many as their leading bits agree), then the ones that defer a bit (while low
        # is 01... and high 10...: as many as low's bits below the top are 1 where high's are
        # 0); no shift of the first kind can follow one of the second. Each shift reads one bit.
        low = self._low
        width = self._high - low + 1
        high = low + ((width * end) >> FREQUENCY_BITS) - 1
        low += (width * start) >> FREQUENCY_BITS
        emits = _STATE_BITS - (low ^ high).bit_length()
        ones = (1 << emits) - 1
        shifted_low = (low << emits) & _FULL
        shifted_high = ((high << emits) & _FULL) | ones
        # below the top bit: the run of places where low has a 1 and high a 0
        defers = _STATE_BITS - 1 - ((~shifted_low | shifted_high) & (_HALF - 1)).bit_length()
        shifts = emits + defers
        position = self._position
        if (shifts and self._shift_limit is not None
                and position + shifts - 1 - _STATE_BITS >= self._shift_limit):
            raise self._exhausted()
        value = self._value
        if emits:
            top = low >> (_STATE_BITS - emits)
            pending = self._pending
            if pending:
                first = top >> (emits - 1)
                self._emitted += [(first, 1), (0 if first else (1 << pending) - 1, pending),
                                  (top & ((1 << (emits - 1)) - 1), emits - 1)]
                self._pending = 0
            else:
                self._emitted.append((top, emits))
            low, high = shifted_low, shifted_high
            value = ((value << emits) & _FULL) | self._read(position, emits)
        if defers:
            # each: x -> 2 (x - QUARTER), plus 1 for high and the bit read for the value
            ones = (1 << defers) - 1
            low = (low << defers) - _HALF * ones
            high = (high << defers) - _HALF * ones + ones
            value = (value << defers) - _HALF * ones + self._read(position + emits, defers)
            self._pending += defers
        self._low, self._high, self._value = low, high, value
        self._position = position + shifts


def least_symbol_bits(largest: int) -> float:
    """A lower bound on the information (bits) one symbol takes from the stream when no table
    gives any symbol a count above ``largest`` (invariant 7), rounded down so that the bound
    holds through the float arithmetic."""
    if not 1 <= largest <= TOTAL_FREQUENCY:
        raise ValueError(f"a symbol's count is in [1, {TOTAL_FREQUENCY}], not {largest}")
    bits = -math.log2(largest / TOTAL_FREQUENCY + 2.0**-62)
    return max(0.0, bits * (1 - 2.0**-40) - 2.0**-40)


def within_code(count: int, least_bits: float, num_bits: int,
                overrun_bits: int = OVERRUN_BITS) -> bool:
    """Whether a decoder guarded with ``overrun_bits`` can produce ``count`` symbols of at
    least ``least_bits`` each from a stream of ``num_bits`` bits (invariant 7): False means the
    guard would refuse the stream before its last symbol, whatever its bits."""
    return count * least_bits <= num_bits + overrun_bits + 2

"""An exact binary arithmetic coder over fixed-point frequency tables, for the token stream.

NOTE: seqkv codes KV residuals with constriction, but not the tokens. Measured here (500 tokens,
49,152-symbol categoricals, 20 streams): constriction's range coder ends its stream on a 32-bit word
boundary and spent 5 to 32 bits (17 on average) over the ideal per stream, ~0.55% of a
3,000-bit stream; real text at 3.5 bits/token over 512 tokens is ~1,800 bits, so that alone
misses the 0.5% target. This coder ends on a bit boundary with at most 2 bits of flush, and its
per-symbol cost is bounded by ``frequencies.py``'s quantization (~1.7e-5 bits/token). Its speed is
irrelevant here: each token costs a model forward step (tens of milliseconds), the coder ~10 us.

The coder is the classic interval-halving scheme with pending ("follow") bits (Witten, Neal and
Cleary, 1987) on 64-bit integer bounds, written with Python integers so no step can overflow.

Invariants:
1. After each symbol the interval [low, high] satisfies ``high - low + 1 > 2**62`` and therefore
   exceeds TOTAL_FREQUENCY = 2**32: every symbol with count >= 1 keeps a non-empty sub-interval
   (enforced by the renormalisation loop).
2. ``finish`` emits at most ``pending + 2`` bits, then drops trailing zero bits: the decoder reads
   zeros past the end of the stream, so they carry no information (enforced; round-trip tested).
3. The code length is at most the sum of ``-log2(count / total)`` plus 2 bits plus a floor
   rounding term below 1e-9 bits per symbol (checked by the property tests).
4. The decoder returns some symbol for any bit string; it cannot tell a wrong stream from a right
   one. Callers verify a checksum of the decoded symbols (``seqkv.codec`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqkv.coding.frequencies import FREQUENCY_BITS, CumulativeTable

_STATE_BITS = 64
_FULL = (1 << _STATE_BITS) - 1
_HALF = 1 << (_STATE_BITS - 1)
_QUARTER = 1 << (_STATE_BITS - 2)
_THREE_QUARTERS = _HALF + _QUARTER


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

    def encode(self, cumulative: CumulativeTable, symbol: int) -> None:
        """Narrow the interval to ``symbol``'s share of ``cumulative``."""
        if self._finished:
            raise RuntimeError("encode() after finish()")
        if not 0 <= symbol < cumulative.shape[0] - 1:
            raise ValueError(f"symbol {symbol} outside a table of {cumulative.shape[0] - 1}")
        start, end = int(cumulative[symbol]), int(cumulative[symbol + 1])
        if end <= start:
            raise ValueError(f"symbol {symbol} has zero frequency")
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
            self._low <<= 1
            self._high = (self._high << 1) | 1

    def finish(self) -> BitStream:
        """Flush the interval and return the bit string; the encoder takes no more symbols."""
        if not self._finished:
            self._finished = True
            self._pending += 1
            self._emit(0 if self._low < _QUARTER else 1)
            while self._bits and self._bits[-1] == 0:
                self._bits.pop()
        bits = np.array(self._bits, dtype=np.uint8)
        return BitStream(np.packbits(bits).tobytes(), len(self._bits))


class ArithmeticDecoder:
    """Decodes symbols in the order they were encoded, given the same tables."""

    def __init__(self, stream: BitStream) -> None:
        self._bits = np.unpackbits(np.frombuffer(stream.data, dtype=np.uint8))[: stream.num_bits]
        self._position = 0
        self._low = 0
        self._high = _FULL
        self._value = 0
        for _ in range(_STATE_BITS):
            self._value = (self._value << 1) | self._next_bit()

    def _next_bit(self) -> int:
        position = self._position
        self._position += 1
        return int(self._bits[position]) if position < self._bits.shape[0] else 0

    def decode(self, cumulative: CumulativeTable) -> int:
        """The next symbol under ``cumulative``."""
        width = self._high - self._low + 1
        target = (((self._value - self._low + 1) << FREQUENCY_BITS) - 1) // width
        symbol = int(np.searchsorted(cumulative, target, side="right")) - 1
        start, end = int(cumulative[symbol]), int(cumulative[symbol + 1])
        self._high = self._low + ((width * end) >> FREQUENCY_BITS) - 1
        self._low = self._low + ((width * start) >> FREQUENCY_BITS)
        while True:
            if self._high < _HALF:
                pass
            elif self._low >= _HALF:
                self._low -= _HALF
                self._high -= _HALF
                self._value -= _HALF
            elif self._low >= _QUARTER and self._high < _THREE_QUARTERS:
                self._low -= _QUARTER
                self._high -= _QUARTER
                self._value -= _QUARTER
            else:
                return symbol
            self._low <<= 1
            self._high = (self._high << 1) | 1
            self._value = (self._value << 1) | self._next_bit()

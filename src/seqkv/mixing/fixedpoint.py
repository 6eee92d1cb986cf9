"""Exact fixed-point logarithms, stretch and squash: the mixer's only non-linear functions.

The mixer must produce bit-identical tables in the encoder and the decoder on any machine, so it
cannot call libm's ``log``/``exp`` (their last bits differ between implementations). This module
builds one table of 2**(f/256) with exact integer arithmetic and derives everything from it with
integer operations only.

Units: a log2 value or a log2-odds ("stretch") value is an integer in units of ``1/ONE`` bit
(``ONE = 4096``); a probability is an integer count out of ``TOTAL = 2**32``.

Invariants:
1. ``GROWTH[f]`` is the smallest integer ``g`` with ``g**256 >= 2**(62*256 + f)``, i.e.
   ``ceil(2**(62 + f/256))`` (checked: the tests verify every entry by exact integer powers).
2. ``log2_fixed(c)`` is within 2 units of ``ONE * log2(c)`` for ``1 <= c < 2**64``: it
   interpolates linearly between table points 1/256 bit apart (checked by tests against floats).
   A caller that needs a safe upper bound of ``ONE * log2(c)`` adds ``LOG2_SLACK``.
3. ``squash(s)`` is non-decreasing in ``s`` and lies in ``[1, TOTAL - 1]`` (enforced by clamping;
   checked by tests); ``squash(stretch(c))`` is within 0.1% of ``c`` (checked).
4. Every function is pure: same integers in, same integers out, on every machine (enforced: only
   Python integer arithmetic).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

FRACTION_BITS = 12
ONE = 1 << FRACTION_BITS
TOTAL_BITS = 32
TOTAL = 1 << TOTAL_BITS
LOG2_SLACK = 2
# NOTE: stretch values are clamped to +-32 bits of log2-odds: a count of 1 out of 2**32 is
# -32 bits, so nothing the coder can represent lies outside.
STRETCH_LIMIT = 32 * ONE
_TABLE_BITS = 8
_INTERPOLATION_BITS = FRACTION_BITS - _TABLE_BITS
_MANTISSA_BITS = 62


_GUARD_BITS = 192


def _growth_entries() -> list[int]:
    """ceil(2**(62 + f/256)) for f = 0..256, by integer square roots at 192-bit precision.

    2**(f/256) is the product of 2**(2**j/256) over the set bits of f; each of those is an
    integer square root of the next. The truncation errors (a few units of 2**-192) cannot move a
    ceiling unless the exact value lies within 2**-120 of an integer; such an entry is settled
    by exact integer powers instead (never needed for this table; the tests check every entry).
    """
    one = 1 << _GUARD_BITS
    roots = [0] * _TABLE_BITS
    roots[-1] = math.isqrt(2 << (2 * _GUARD_BITS))  # 2**(128/256)
    for j in range(_TABLE_BITS - 2, -1, -1):
        roots[j] = math.isqrt(roots[j + 1] << _GUARD_BITS)
    entries = []
    for f in range(256):
        value = one
        for j in range(_TABLE_BITS):
            if f >> j & 1:
                value = (value * roots[j]) >> _GUARD_BITS
        scaled = value << _MANTISSA_BITS  # 2**(62 + f/256) in units of 2**-192
        ceiling = -(-scaled >> _GUARD_BITS)
        remainder = scaled & (one - 1)
        if f and not (1 << 72) < remainder < one - (1 << 72):
            ceiling = _exact_growth_entry(f)
        entries.append(ceiling)
    return [*entries, 1 << (_MANTISSA_BITS + 1)]


def _exact_growth_entry(f: int) -> int:
    """The smallest g with g**256 >= 2**(62*256 + f), by bisection on exact powers."""
    target = 1 << (_MANTISSA_BITS * 256 + f)
    low, high = (1 << _MANTISSA_BITS) - 1, 1 << (_MANTISSA_BITS + 1)
    while high - low > 1:
        middle = (low + high) // 2
        if middle**256 >= target:
            high = middle
        else:
            low = middle
    return high


@dataclass(frozen=True, slots=True)
class FixedPoint:
    """The exact table of 2**(62 + f/256), f = 0..256, and the functions built on it.

    Building it costs well under a millisecond (integer square roots); tests check every entry.

    >>> fixed = FixedPoint.build()
    >>> fixed.log2_fixed(8) == 3 * ONE, fixed.squash(0) == TOTAL // 2
    (True, True)
    >>> fixed.stretch(TOTAL // 5) / ONE  # log2(0.2 / 0.8) = -2
    -2.0
    """

    growth: tuple[int, ...]

    @classmethod
    def build(cls) -> FixedPoint:
        return cls(tuple(_growth_entries()))

    def log2_fixed(self, value: int) -> int:
        """``ONE * log2(value)`` to within ``LOG2_SLACK`` units, for ``1 <= value < 2**64``."""
        assert 1 <= value < 1 << 64
        exponent = value.bit_length() - 1
        shift = _MANTISSA_BITS - exponent
        mantissa = value << shift if shift >= 0 else value >> -shift  # in [2**62, 2**63)
        f = bisect.bisect_right(self.growth, mantissa) - 1
        low, high = self.growth[f], self.growth[f + 1]
        fraction = ((mantissa - low) << _INTERPOLATION_BITS) // (high - low)
        return (exponent << FRACTION_BITS) + (f << _INTERPOLATION_BITS) + fraction

    def exp2_mantissa(self, fraction: int) -> int:
        """``2**(62 + fraction/ONE)`` (interpolated) for ``0 <= fraction <= ONE``."""
        assert 0 <= fraction <= ONE
        f, rest = fraction >> _INTERPOLATION_BITS, fraction & ((1 << _INTERPOLATION_BITS) - 1)
        low = self.growth[f]
        if rest == 0:
            return low
        return low + (((self.growth[f + 1] - low) * rest) >> _INTERPOLATION_BITS)

    def stretch(self, count: int) -> int:
        """log2-odds of ``count / TOTAL`` in units of ``1/ONE`` bit, for ``0 < count < TOTAL``."""
        assert 0 < count < TOTAL
        value = self.log2_fixed(count) - self.log2_fixed(TOTAL - count)
        return max(-STRETCH_LIMIT, min(STRETCH_LIMIT, value))

    def squash(self, stretch: int) -> int:
        """The count out of ``TOTAL`` whose log2-odds is ``stretch / ONE``, in [1, TOTAL - 1]."""
        magnitude = min(abs(stretch), STRETCH_LIMIT)
        whole, fraction = divmod(magnitude, ONE)
        # 2**(-magnitude) in units of 2**-62: 2**(62 + (1 - fraction)) / 2 / 2**whole.
        small = self.exp2_mantissa(ONE - fraction) >> (1 + whole)
        denominator = (1 << _MANTISSA_BITS) + small
        if stretch >= 0:
            count = (1 << (_MANTISSA_BITS + TOTAL_BITS)) // denominator
        else:
            count = (small << TOTAL_BITS) // denominator
        return max(1, min(TOTAL - 1, count))

"""Portable fixed-point math: the transcendental functions of a Llama forward in integers.

The integer predictor must compute the same bits on every machine and device, so nothing in its
forward may call the platform's libm or a float transcendental kernel: those differ between
libraries, vector widths and devices. This module gives each function the predictor needs as

* a table, built once with exact software arithmetic (``mpmath`` at a fixed working precision,
  or Python integers: ``math.isqrt``), so the table is the same everywhere;
* an evaluation with integer tensor ops only (int64 add, multiply, shifts, comparisons, gather),
  each of which has one defined result on every device.

Formats. A fixed-point number with ``f`` fractional bits is an int64 ``x`` standing for
``x / 2**f``. Right shifts floor (two's complement arithmetic shift); every shift amount is
clamped to ``[0, 62]`` before use, because shifting an int64 by a negative amount or by 64 or
more is undefined in C and differs between CPUs and GPUs.

Functions and their documented errors (checked against float64 references by
``tests/test_integer_fixedpoint.py``):

============================  ============================================================
``bit_length``                exact
``exp2_neg``                  ``2**(out - d)``: relative error <= 2**-29 before the final
                              rounding to ``out`` fractional bits (0.5 ulp)
``exp2_neg_fine`` (numpy)     the same with a two-level table over 20 fractional bits:
                              relative error <= 2**-29 before the final floor
``rsqrt``                     ``2**out / sqrt(v)``: relative error <= 5e-7, plus 1 ulp
``sigmoid``                   ``2**30 * sigmoid(x)``: absolute error <= 1e-6 * 2**30
``rope_tables``               cos and sin at 2**-30: absolute error <= 2**-29
``log2_fine`` (numpy)         log2 of a positive integer: absolute error <= 2e-7
============================  ============================================================

Invariants:
1. Every table is a pure function of its size parameters, built with mpmath at
   ``_WORKING_PRECISION`` bits or with exact integer arithmetic (enforced: no float math calls).
2. The evaluation functions use integer tensor ops only, and every shift amount lies in
   ``[0, 62]`` (enforced by clamps).
3. Inputs are within the stated domains (assumed; callers bound their values, see forward.py).

Nothing here mutates its arguments; the tables are immutable once built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import mpmath
import numpy as np
import numpy.typing as npt
import torch

IntArray = npt.NDArray[np.int64]

# NOTE: 120 bits is far beyond every table's 30-46 output bits, so rounding a table entry can
# only differ from the exact value's rounding if the exact value lay within 2**-120 of a rounding
# boundary; mpmath is pure Python integer arithmetic, so the entries are the same everywhere.
_WORKING_PRECISION = 120
MAX_SHIFT = 62

TABLE_BITS = 30  # fractional bits of the exp2, sigmoid and rope tables
EXP2_FRAC_BITS = 12  # attention: log2 logits with 12 fractional bits index a 4096-entry table
FINE_FRAC_BITS = 20  # output table: two 1024-entry levels
_FINE_HALF = FINE_FRAC_BITS // 2
RSQRT_CELL_BITS = 21  # the rsqrt argument, scaled into [2**30, 2**32), in cells of 2**21
_RSQRT_TABLE_BITS = 46
_RSQRT_LOW = 1 << (30 - RSQRT_CELL_BITS)  # first cell index: 2**30 >> 21
SIGMOID_STEP_BITS = 7  # the sigmoid table's grid step is 2**-7
SIGMOID_RANGE = 16  # beyond +-16 sigmoid is 0 or 1 to within 1.2e-7
_LOG2_INDEX_BITS = 10


def _mp_round_scaled(value: mpmath.mpf, bits: int) -> int:
    """round(value * 2**bits) as a Python int, computed in mpmath's exact binary arithmetic."""
    return int(mpmath.nint(mpmath.ldexp(value, bits)))


@lru_cache(maxsize=None)
def exp2_table(frac_bits: int) -> tuple[int, ...]:
    """``round(2**TABLE_BITS * 2**(-i / 2**frac_bits))`` for ``i`` in ``[0, 2**frac_bits)``."""
    with mpmath.workprec(_WORKING_PRECISION):
        return tuple(_mp_round_scaled(mpmath.mpf(2) ** (-mpmath.mpf(i) / (1 << frac_bits)),
                                      TABLE_BITS)
                     for i in range(1 << frac_bits))


@lru_cache(maxsize=None)
def rsqrt_table() -> tuple[int, ...]:
    """``floor(2**46 / sqrt(n * 2**21))`` for ``n`` in ``[2**9, 2**11]`` (1537 entries), exact:
    ``isqrt(floor(a / b)) == floor(sqrt(a / b))``."""
    return tuple(math.isqrt((1 << (2 * _RSQRT_TABLE_BITS)) // (n << RSQRT_CELL_BITS))
                 for n in range(_RSQRT_LOW, 4 * _RSQRT_LOW + 1))


@lru_cache(maxsize=None)
def sigmoid_table() -> tuple[int, ...]:
    """``round(2**30 * sigmoid(x))`` on the grid ``x = -16 + i / 2**7``, ``i`` in
    ``[0, 2 * 16 * 2**7]`` (the last entry only serves interpolation)."""
    count = 2 * SIGMOID_RANGE * (1 << SIGMOID_STEP_BITS) + 1
    with mpmath.workprec(_WORKING_PRECISION):
        return tuple(
            _mp_round_scaled(
                1 / (1 + mpmath.exp(SIGMOID_RANGE - mpmath.mpf(i) / (1 << SIGMOID_STEP_BITS))),
                TABLE_BITS)
            for i in range(count))


@lru_cache(maxsize=None)
def log2_table() -> tuple[int, ...]:
    """``round(2**30 * log2(1 + i / 1024))`` for ``i`` in ``[0, 1024]``."""
    size = 1 << _LOG2_INDEX_BITS
    with mpmath.workprec(_WORKING_PRECISION):
        return tuple(_mp_round_scaled(mpmath.log(1 + mpmath.mpf(i) / size, 2), TABLE_BITS)
                     for i in range(size + 1))


def rope_tables(head_dim: int, theta: float, positions: int) -> tuple[IntArray, IntArray]:
    """Rotary cos and sin at ``2**-30`` for every position and frequency: ``[positions,
    head_dim // 2]`` each, in transformers' Llama convention (frequency ``i`` is
    ``theta ** (-2 i / head_dim)``).

    A position ``p = 256 a + b`` is rotated by the sum of two angles, each looked up in a table
    computed with mpmath: cos(A + B) = cos A cos B - sin A sin B, in exact integer arithmetic and
    rounded once. Each table entry is within 2**-31 of the truth, so the result is within
    2**-29 (checked by the tests against float64).
    """
    half = head_dim // 2
    blocks = -(-positions // 256)
    with mpmath.workprec(_WORKING_PRECISION):
        base = mpmath.mpf(theta)
        frequencies = [base ** (-mpmath.mpf(2 * i) / head_dim) for i in range(half)]

        def table(count: int, stride: int) -> tuple[IntArray, IntArray]:
            cos = np.empty((count, half), dtype=np.int64)
            sin = np.empty((count, half), dtype=np.int64)
            for n in range(count):
                for i, frequency in enumerate(frequencies):
                    angle = n * stride * frequency
                    cos[n, i] = _mp_round_scaled(mpmath.cos(angle), TABLE_BITS)
                    sin[n, i] = _mp_round_scaled(mpmath.sin(angle), TABLE_BITS)
            return cos, sin

        cos_a, sin_a = table(blocks, 256)
        cos_b, sin_b = table(256, 1)
    p = np.arange(blocks * 256)
    a, b = p // 256, p % 256
    half_unit = 1 << (TABLE_BITS - 1)
    # Each product is below 2**60 in magnitude and their sum below 2**61: exact in int64.
    cos = (cos_a[a] * cos_b[b] - sin_a[a] * sin_b[b] + half_unit) >> TABLE_BITS
    sin = (sin_a[a] * cos_b[b] + cos_a[a] * sin_b[b] + half_unit) >> TABLE_BITS
    return cos[:positions], sin[:positions]


@dataclass(frozen=True)
class FixedPointTables:
    """The runtime tables on one device (int64 tensors)."""

    powers_of_two: torch.Tensor  # [63]: 2**0 .. 2**62
    exp2: torch.Tensor  # [2**EXP2_FRAC_BITS]
    rsqrt: torch.Tensor  # [3 * 2**9 + 1]
    sigmoid: torch.Tensor  # [2 * 16 * 2**7 + 1]

    @classmethod
    def on(cls, device: torch.device) -> FixedPointTables:
        def tensor(values: tuple[int, ...] | list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return cls(
            powers_of_two=tensor([1 << i for i in range(63)]),
            exp2=tensor(exp2_table(EXP2_FRAC_BITS)),
            rsqrt=tensor(rsqrt_table()),
            sigmoid=tensor(sigmoid_table()),
        )


def bit_length(x: torch.Tensor, tables: FixedPointTables) -> torch.Tensor:
    """Elementwise bit length of non-negative int64 ``x`` (0 for 0): exact."""
    return (x.unsqueeze(-1) >= tables.powers_of_two).sum(-1)


def shift_signed(x: torch.Tensor, amount: torch.Tensor) -> torch.Tensor:
    """``floor(x * 2**-amount)`` for amounts of either sign (left shift when negative).

    The caller bounds ``x * 2**-amount`` below 2**63; both shifts are clamped to [0, 62].
    """
    left = (-amount).clamp(0, MAX_SHIFT)
    right = amount.clamp(0, MAX_SHIFT)
    return (x << left) >> right


def exp2_neg(d: torch.Tensor, out_bits: int, tables: FixedPointTables) -> torch.Tensor:
    """``round(2**(out_bits - d / 2**EXP2_FRAC_BITS))`` for ``d >= 0`` (int64 fixed point).

    The table entry carries 2**-31 relative error; the result is rounded to the nearest integer
    at ``out_bits`` fractional bits (an exact tie rounds up). Large ``d`` gives 0.
    """
    whole = d >> EXP2_FRAC_BITS
    mantissa = tables.exp2[d & ((1 << EXP2_FRAC_BITS) - 1)]
    shift = (whole + (TABLE_BITS - out_bits - 1)).clamp(0, MAX_SHIFT)
    return ((mantissa >> shift) + 1) >> 1


def rsqrt(v: torch.Tensor, out_bits: int, tables: FixedPointTables) -> torch.Tensor:
    """``2**out_bits / sqrt(v)`` for int64 ``v >= 1``, to a relative error below 5e-7.

    ``v`` is scaled by an even power of two into ``[2**30, 2**32)``; its bits above the lowest 21
    index the table and those 21 interpolate linearly. The linear interpolation of ``x**-0.5``
    over a cell of relative width at most ``2**-9`` errs by at most ``3/32 * 2**-18`` (3.6e-7
    relative); the table entries by 2**-30; the result is floored (1 ulp). The caller keeps the
    result below 2**62 (``out_bits - log2(v) / 2 < 62``) and ``out_bits <= 46 + 15``.
    """
    length = bit_length(v, tables)
    half_shift = torch.div(length - 31, 2, rounding_mode="floor")  # v = vn * 4**half_shift
    normalized = shift_signed(v, 2 * half_shift)  # [2**30, 2**32)
    index = (normalized >> RSQRT_CELL_BITS) - _RSQRT_LOW
    fraction = normalized & ((1 << RSQRT_CELL_BITS) - 1)
    low = tables.rsqrt[index]
    high = tables.rsqrt[index + 1]
    # (low - high) < 2**21 and fraction < 2**21: the product is exact in int64.
    mantissa = low - (((low - high) * fraction) >> RSQRT_CELL_BITS)  # 2**46 / sqrt(normalized)
    return shift_signed(mantissa, _RSQRT_TABLE_BITS - out_bits + half_shift)


def sigmoid(x: torch.Tensor, frac_bits: int, tables: FixedPointTables) -> torch.Tensor:
    """``2**30 * sigmoid(x / 2**frac_bits)`` (int64), for ``frac_bits >= 7``.

    Linear interpolation on a 2**-7 grid over [-16, 16]: the error is at most
    ``2**-14 / 8 * max|sigmoid''| = 7.4e-7``, plus 2**-31 from the table; outside the grid the
    value is 0 or 1 within 1.2e-7.
    """
    bound = SIGMOID_RANGE << frac_bits
    clamped = x.clamp(-bound, bound - 1)
    cell_bits = frac_bits - SIGMOID_STEP_BITS
    index = (clamped >> cell_bits) + (SIGMOID_RANGE << SIGMOID_STEP_BITS)
    fraction = clamped & ((1 << cell_bits) - 1)
    low = tables.sigmoid[index]
    high = tables.sigmoid[index + 1]
    return low + (((high - low) * fraction) >> cell_bits)


def bit_length_np(x: IntArray) -> IntArray:
    """Elementwise bit length of a non-negative int64 array (0 for 0): exact."""
    powers = np.left_shift(np.int64(1), np.arange(63, dtype=np.int64))
    return np.asarray((x[..., None] >= powers).sum(-1), dtype=np.int64)


@lru_cache(maxsize=None)
def _fine_tables() -> tuple[IntArray, IntArray]:
    """Two levels of 2**-(i / 2**20): whole steps of 2**-10 and the steps within them."""
    fine = np.array(exp2_table(FINE_FRAC_BITS - _FINE_HALF), dtype=np.int64)  # 2**-(i/1024)
    with mpmath.workprec(_WORKING_PRECISION):
        step = mpmath.mpf(2) ** (-mpmath.mpf(1) / (1 << FINE_FRAC_BITS))
        low = np.array([_mp_round_scaled(step ** i, TABLE_BITS)
                        for i in range(1 << _FINE_HALF)], dtype=np.int64)
    fine.setflags(write=False)
    low.setflags(write=False)
    return fine, low


def exp2_neg_fine(d: IntArray, out_bits: int) -> IntArray:
    """``floor(2**(out_bits - d / 2**20))`` for int64 ``d >= 0`` and ``out_bits <= 46``.

    Two table levels (the top and bottom 10 fractional bits), each entry within 2**-31 relative
    of the truth, so their product is within 2**-29 relative before the final floor.
    """
    high, low = _fine_tables()
    fraction = d & ((1 << FINE_FRAC_BITS) - 1)
    # 2**60 * 2**(-fraction / 2**20): both factors are at most 2**30.
    product = high[fraction >> _FINE_HALF] * low[fraction & ((1 << _FINE_HALF) - 1)]
    shift = np.minimum((d >> FINE_FRAC_BITS) + (2 * TABLE_BITS - out_bits), MAX_SHIFT)
    return np.asarray(product >> shift, dtype=np.int64)


def log2_fine(x: IntArray) -> npt.NDArray[np.float64]:
    """log2 of positive int64 values, absolute error below 2e-7 (for reports, not for coding).

    The value is normalized to ``[2**30, 2**31)``; its top 10 fraction bits index a table of
    ``log2(1 + i/1024)`` and the rest interpolate (error at most ``(2**-10)**2 / 8 / ln 2``).
    """
    table = np.array(log2_table(), dtype=np.int64)
    length = bit_length_np(x)
    shift = length - 31
    normalized = np.where(shift >= 0, x >> np.maximum(shift, 0), x << np.maximum(-shift, 0))
    cell_bits = 30 - _LOG2_INDEX_BITS
    index = (normalized >> cell_bits) - (1 << _LOG2_INDEX_BITS)
    fraction = normalized & ((1 << cell_bits) - 1)
    low = table[index]
    value = low + (((table[index + 1] - low) * fraction) >> cell_bits)
    return np.asarray((length - 1) + value * 2.0**-TABLE_BITS, dtype=np.float64)

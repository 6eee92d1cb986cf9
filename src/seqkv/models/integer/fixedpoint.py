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
``excess_bits``               exact
``softmax_weights``           ``2**(14 - d)`` rounded to an integer (0.5 ulp; entries from
                              a table within 2**-31 relative)
``exp2_neg_fine`` (numpy)     ``2**(out - d)`` floored, from a two-level table over 20
                              fractional bits: relative error <= 2**-29 before the floor
``rsqrt`` / ``rsqrt_parts``   ``2**out / sqrt(v)`` for v >= 2**24: relative error
                              <= 2**-17 + 2**-30, plus the final floor
``sigmoid``                   ``2**30 * sigmoid(x)``: absolute error <= 2**-16 + 2**-31,
                              and <= sigmoid(x) * 2**-14 + 2**-31
``rope_tables``               cos and sin at 2**-30: absolute error <= 2**-29
``log2_fine`` (numpy)         log2 of a positive integer: absolute error <= 2e-7
============================  ============================================================

Invariants:
1. Every table is a pure function of its size parameters, built with mpmath at
   ``_WORKING_PRECISION`` bits or with exact integer arithmetic (enforced: no float math calls);
   ``tests/test_integer_fixedpoint.py`` pins their SHA-256.
2. The evaluation functions use integer tensor ops only, and every shift amount lies in
   ``[0, 62]`` (enforced by clamps or bounded by construction).
3. Inputs are within the stated domains (assumed; callers bound their values, see forward.py).

Nothing here mutates its arguments. The table builders are memoized with ``functools.cache``:
pure functions of their arguments returning immutable tuples or read-only arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import mpmath  # type: ignore[import-untyped]
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
SOFTMAX_BITS = 14  # attention weights: at most 2**14 - 1, two int8 planes
FINE_FRAC_BITS = 20  # output table: two 1024-entry levels
_FINE_HALF = FINE_FRAC_BITS // 2
# NOTE: rsqrt scales its argument into [2**24, 2**26) and looks up the cell of 2**9 it falls
# in, at the cell's midpoint: relative error <= 2**-17 (7.6e-6), with no interpolation. The
# interpolated table it replaced (3.6e-7) cost six more torch calls per RMSNorm (61 per step);
# 7.6e-6 is a deterministic scale error per row, far below the 6e-5 of 14-bit activations.
RSQRT_CELL_BITS = 9
RSQRT_MANTISSA_BITS = 42  # the table holds 2**42 / sqrt(cell midpoint): below 2**30
RSQRT_MIN = 1 << 24  # rsqrt's domain: smaller arguments are raised to it
RSQRT_MAX = (1 << 62) - 1
# NOTE: a 2**-13 grid looked up at the nearest point (one gather, no interpolation) errs by at
# most max|sigmoid'| * 2**-14 = 2**-16 absolute, 2**-14 relative; the interpolated 2**-7 grid
# it replaced was exact to 7e-7 but cost four more passes over the [rows, 1536] gate (counted
# in a 256-token prefill profile: 8 of the MLP's 23 elementwise passes were the sigmoid's).
SIGMOID_STEP_BITS = 13
SIGMOID_RANGE = 16  # beyond +-16 sigmoid is 0 or 1 to within 1.2e-7
_LOG2_INDEX_BITS = 10


def _mp_round_scaled(value: mpmath.mpf, bits: int) -> int:
    """round(value * 2**bits) as a Python int, computed in mpmath's exact binary arithmetic."""
    return int(mpmath.nint(mpmath.ldexp(value, bits)))


@cache
def exp2_table(frac_bits: int) -> tuple[int, ...]:
    """``round(2**TABLE_BITS * 2**(-i / 2**frac_bits))`` for ``i`` in ``[0, 2**frac_bits)``."""
    with mpmath.workprec(_WORKING_PRECISION):
        return tuple(_mp_round_scaled(mpmath.mpf(2) ** (-mpmath.mpf(i) / (1 << frac_bits)),
                                      TABLE_BITS)
                     for i in range(1 << frac_bits))


@cache
def rsqrt_table() -> tuple[int, ...]:
    """``round(2**42 / sqrt((n + 1/2) * 2**9))`` for ``n`` in ``[0, 2**17)`` (entries below
    ``2**15`` are 0: no normalized argument reaches them), by exact integer arithmetic:
    ``isqrt(floor(a / b)) == floor(sqrt(a / b))`` of twice the value, then halved rounding
    up."""
    low = 1 << (24 - RSQRT_CELL_BITS)
    entries = [0] * low
    for n in range(low, 4 * low):
        # (2 * value)**2 = 4 * 2**84 / ((n + 1/2) * 2**9) = 2**87 / ((2n + 1) * 2**9)
        doubled = math.isqrt((1 << 87) // ((2 * n + 1) << RSQRT_CELL_BITS))
        entries.append((doubled + 1) >> 1)
    return tuple(entries)


@cache
def exp2_neg_table(out_bits: int, top: int) -> tuple[int, ...]:
    """``min(top, round(2**(out_bits - d / 2**12)))`` for every ``d`` until the value is 0
    (ties round up), from ``exp2_table(12)``: the last entry is 0 and serves every larger d."""
    mantissas = exp2_table(EXP2_FRAC_BITS)
    entries = []
    d = 0
    while True:
        whole, fraction = divmod(d, 1 << EXP2_FRAC_BITS)
        value = ((mantissas[fraction] >> (whole + TABLE_BITS - out_bits - 1)) + 1) >> 1
        entries.append(min(top, value))
        if value == 0:
            return tuple(entries)
        d += 1


@cache
def sigmoid_table() -> tuple[int, ...]:
    """``round(2**30 * sigmoid(x))`` on the grid ``x = -16 + i / 2**13``, ``i`` in
    ``[0, 2 * 16 * 2**13)``, in exact integer arithmetic.

    ``exp(-k / 2**13)`` at 2**-100 comes from repeated multiplication by ``exp(-2**-13)``
    (computed once with mpmath); each step floors, so after 2**17 steps the relative error is
    below 2**-82, far below the 2**-31 of the final rounding. Then
    ``sigmoid(y) = 1 / (1 + e)`` and ``sigmoid(-y) = e / (1 + e)`` with ``e = exp(-y)`` are
    rounded by exact integer division.
    """
    one = 1 << 100
    steps = SIGMOID_RANGE << SIGMOID_STEP_BITS
    with mpmath.workprec(_WORKING_PRECISION):
        factor = _mp_round_scaled(mpmath.exp(-mpmath.mpf(1) / (1 << SIGMOID_STEP_BITS)), 100)
    decays = [one]
    for _ in range(steps):
        decays.append((decays[-1] * factor) >> 100)

    def rounded(numerator: int, denominator: int) -> int:
        return ((numerator << (TABLE_BITS + 1)) // denominator + 1) >> 1

    negative = [rounded(decays[k], one + decays[k]) for k in range(steps, 0, -1)]
    positive = [rounded(one, one + decays[k]) for k in range(steps)]
    return tuple(negative + positive)


@cache
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

    thresholds: tuple[torch.Tensor, ...]  # thresholds[b]: [63 - b] = 2**b .. 2**62
    softmax: torch.Tensor  # exp2_neg_table(SOFTMAX_BITS, 2**SOFTMAX_BITS - 1)
    rsqrt: torch.Tensor  # int32 [2**17]
    sigmoid: torch.Tensor  # int32 [2 * 16 * 2**13]

    @classmethod
    def on(cls, device: torch.device) -> FixedPointTables:
        def tensor(values: tuple[int, ...] | list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return cls(
            thresholds=tuple(tensor([1 << i for i in range(b, 63)]) for b in range(63)),
            softmax=tensor(exp2_neg_table(SOFTMAX_BITS, (1 << SOFTMAX_BITS) - 1)),
            rsqrt=tensor(rsqrt_table()).to(torch.int32),
            sigmoid=tensor(sigmoid_table()).to(torch.int32),
        )


def bit_length(x: torch.Tensor, tables: FixedPointTables) -> torch.Tensor:
    """Elementwise bit length of non-negative int64 ``x`` (0 for 0): exact."""
    return excess_bits(x, 0, tables)


def excess_bits(x: torch.Tensor, bits: int, tables: FixedPointTables) -> torch.Tensor:
    """``max(0, bit_length(x) - bits)`` for non-negative int64 ``x``: the smallest ``s >= 0``
    with ``x >> s < 2**bits`` (exact; it counts the powers ``2**bits .. 2**62`` that ``x``
    reaches)."""
    if x.shape[-1] == 1:  # a column (a row maximum kept as [..., 1]): broadcast directly
        return (x >= tables.thresholds[bits]).sum(-1, keepdim=True)
    return (x.unsqueeze(-1) >= tables.thresholds[bits]).sum(-1)


def _gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for a 1-D or 2-D table and any index shape.

    NOTE: index_select, not advanced indexing: several times faster for the hundreds of
    thousands of indices into tens of thousands of entries a table pass gathers.
    """
    flat = table.index_select(0, index.reshape(-1))
    return flat.view(*index.shape, *table.shape[1:])


def shift_signed(x: torch.Tensor, amount: torch.Tensor) -> torch.Tensor:
    """``floor(x * 2**-amount)`` for amounts of either sign (left shift when negative).

    The caller bounds ``x * 2**-amount`` below 2**63; both shifts are clamped to [0, 62].
    """
    left = (-amount).clamp(0, MAX_SHIFT)
    right = amount.clamp(0, MAX_SHIFT)
    return (x << left) >> right


def softmax_weights(d: torch.Tensor, tables: FixedPointTables) -> torch.Tensor:
    """``min(2**14 - 1, round(2**(14 - d / 2**12)))`` for int64 ``d >= 0``: one table gather.

    The table comes from ``exp2_table``, whose entries are within 2**-31 of the truth, so each
    weight is the correctly rounded value except within 2**-17 of a rounding tie.
    """
    return _gather(tables.softmax, d.clamp(max=tables.softmax.shape[0] - 1))


def rsqrt_parts(v: torch.Tensor, tables: FixedPointTables) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mantissa, half)`` with ``2**42 / sqrt(v) ~= mantissa * 2**-half`` for int64 ``v``
    (raised to at least 2**24); ``mantissa`` is int32 in ``(2**29, 2**30]``, relative error
    below ``2**-17 + 2**-30``.

    ``v >> 2 half`` falls in ``[2**24, 2**26)``; the table holds ``2**42 / sqrt`` at the
    midpoint of its cell of 2**9, whose relative width is at most 2**-15.
    """
    raised = v.clamp(min=RSQRT_MIN)
    twice = excess_bits(raised, 25, tables) & -2  # even: v >> twice in [2**24, 2**26)
    mantissa = _gather(tables.rsqrt, (raised >> twice) >> RSQRT_CELL_BITS)
    return mantissa, twice >> 1


def rsqrt(v: torch.Tensor, out_bits: int, tables: FixedPointTables) -> torch.Tensor:
    """``2**out_bits / sqrt(v)`` for int64 ``v >= 2**24`` (smaller values are raised to it) and
    ``out_bits <= 42``: relative error below ``2**-17 + 2**-30``, plus the final floor."""
    mantissa, half = rsqrt_parts(v, tables)
    return mantissa.to(torch.int64) >> (half + (RSQRT_MANTISSA_BITS - out_bits))


def sigmoid(x: torch.Tensor, frac_bits: int, tables: FixedPointTables) -> torch.Tensor:
    """``2**30 * sigmoid(x / 2**frac_bits)`` (int32), for int64 ``x`` and ``frac_bits >= 14``.

    The nearest point of the 2**-13 grid over [-16, 16): the error is at most
    ``2**-16 + 2**-31`` and at most ``sigmoid(x) * 2**-14 + 2**-31`` (since
    ``sigmoid' = sigmoid * (1 - sigmoid)``); outside the grid the value is 0 or 1 within 1.2e-7.
    """
    cell_bits = frac_bits - SIGMOID_STEP_BITS
    bound = SIGMOID_RANGE << frac_bits
    index = (x + (bound + (1 << (cell_bits - 1)))).clamp(0, 2 * bound - 1) >> cell_bits
    return _gather(tables.sigmoid, index)


def bit_length_np(x: IntArray) -> IntArray:
    """Elementwise bit length of a non-negative int64 array (0 for 0): exact."""
    powers = np.left_shift(np.int64(1), np.arange(63, dtype=np.int64))
    return np.asarray((x[..., None] >= powers).sum(-1), dtype=np.int64)


@cache
def fine_tables() -> tuple[IntArray, IntArray]:
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
    high, low = fine_tables()
    fraction = d & ((1 << FINE_FRAC_BITS) - 1)
    # 2**60 * 2**(-fraction / 2**20): both factors are at most 2**30.
    product = high[fraction >> _FINE_HALF] * low[fraction & ((1 << _FINE_HALF) - 1)]
    shift = np.minimum((d >> FINE_FRAC_BITS) + (2 * TABLE_BITS - out_bits), MAX_SHIFT)
    return np.asarray(product >> shift, dtype=np.int64)


@cache
def _log2_array() -> IntArray:
    table = np.array(log2_table(), dtype=np.int64)
    table.setflags(write=False)
    return table


def log2_fine(x: IntArray) -> npt.NDArray[np.float64]:
    """log2 of positive int64 values, absolute error below 2e-7 (for reports, not for coding).

    The value is normalized to ``[2**30, 2**31)``; its top 10 fraction bits index a table of
    ``log2(1 + i/1024)`` and the rest interpolate (error at most ``(2**-10)**2 / 8 / ln 2``).
    """
    table = _log2_array()
    length = bit_length_np(x)
    shift = length - 31
    normalized = np.where(shift >= 0, x >> np.maximum(shift, 0), x << np.maximum(-shift, 0))
    cell_bits = 30 - _LOG2_INDEX_BITS
    index = (normalized >> cell_bits) - (1 << _LOG2_INDEX_BITS)
    fraction = normalized & ((1 << cell_bits) - 1)
    low = table[index]
    value = low + (((table[index + 1] - low) * fraction) >> cell_bits)
    return np.asarray((length - 1) + value * 2.0**-TABLE_BITS, dtype=np.float64)

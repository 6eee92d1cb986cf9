"""Integer logits to the coder's cumulative frequency table, the same bits on every machine.

The float path (``seqkv.coding.frequencies.table_and_log2p``) runs ``np.exp`` and a float sum,
whose bits depend on the math library and the summation order. Here a row of the integer
predictor's logits (int64 at ``2**-LOGIT_FRAC``) becomes a table with

* integer ops: the row maximum, the base-2 exponent ``z = (max - l) * log2(e)`` at ``2**-20``,
  the weights ``p = 2**(P - z)`` from exact tables (``fixedpoint.exp2_neg_fine``), their
  exact int64 sum ``S``, the settling of the remainder and the cumulative sum;
* IEEE-754 float64 elementwise operations, each correctly rounded and so the same everywhere:
  ``count = floor(p * ((2**32 - V) / S)) + 1`` (``p < 2**53`` converts exactly; ``S`` converts
  with one rounding).

No float reduction and no transcendental function touches the table. The same contract as
``seqkv.coding.frequencies.cumulative_from_counts``: a length ``V + 1`` int64 array from 0 to
``2**32`` in which every symbol has a count of at least 1.

Dynamic range: ``P = 61 - bit_length(V)`` (45 at V = 49,152), so every token within 45 bits of
the most likely one has a weight of at least 1 and costs its own surprisal; a token further
out gets the floor count 1 (32 bits), less than its surprisal. Each count is at least
``p / S * (2**32 - V)``, so the table costs at most ``-log2(1 - V / 2**32)`` (1.65e-5 bits at
V = 49,152) over the integer model's ``-log2 p``, plus the exp2 tables' ``2**-29`` relative
error (both measured by ``benchmarks/integer_predictor.py``).

Invariants:
1. Every count is at least 1 and the counts sum to ``TOTAL_FREQUENCY`` (enforced, asserted).
2. The table is a pure function of the logit row's integers (enforced by construction).
3. The log2-probabilities are for reports: ``P - z / 2**20 - log2(S)`` with a table-based
   ``log2``: within 1.5e-6 bits of the exact softmax of the integer logits (``z`` rounded to
   2**-21, ``log2`` within 2e-7); they never feed the table.
4. So is each row's entropy, of the distribution ``p / S``: ``log2(S) - P + sum(p * z) / S /
   2**20`` (at least 0), from a sum the table pass adds up anyway (native.c's
   ``weighted_gaps``), not from a second pass over the row's log2-probabilities (that pass,
   ``exp2`` over every vocabulary entry per coded token, is a visible share of a portable
   encode). It agrees with ``-sum(2**log2p * log2p)`` to about
   1e-7 bits (the same two approximations); it never feeds the table either.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from seqkv.coding.frequencies import FREQUENCY_BITS, TOTAL_FREQUENCY
from seqkv.limits import MAX_VOCAB
from seqkv.models.integer import native
from seqkv.models.integer.fixedpoint import (
    FINE_FRAC_BITS,
    bit_length_np,
    exp2_neg_fine,
    fine_tables,
    log2_fine,
)
from seqkv.models.integer.forward import LOGIT_FRAC

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class IntegerTables(NamedTuple):
    """What the coder and the reports take from integer logit rows (one row: 1-D fields and a
    0-D entropy)."""

    cumulative: IntArray  # [R, V + 1], 0 .. 2**32: the coder's tables
    log2p: FloatArray  # [R, V]: the log2-probabilities (reports; invariant 3)
    entropy: FloatArray  # [R]: each row's entropy in bits (reports; invariant 4)


_LOG2E_BITS = 36
LOG2E_FIXED = 99141248300  # round(log2(e) * 2**36); the tests recompute it with mpmath
# NOTE: logit gaps beyond 2**7 nats (185 bits) are clamped: such a token's weight is 0 anyway,
# and the clamp keeps gap * log2(e) * 2**36 below 2**62.
_MAX_GAP = 1 << (LOGIT_FRAC + 7)
_GAP_SHIFT = _LOG2E_BITS + LOGIT_FRAC - FINE_FRAC_BITS


def _checked(logits: npt.NDArray[np.integer], ndim: int) -> IntArray:
    rows = np.asarray(logits)
    if rows.ndim != ndim or rows.dtype.kind not in "iu":
        raise ValueError(f"expected {ndim}-D integer logits (int64 at 2**-{LOGIT_FRAC}), got "
                         f"{rows.ndim}-D {rows.dtype}")
    vocab = rows.shape[-1]
    if not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"expected 1..{MAX_VOCAB} logits per row, got {vocab}")
    return rows.astype(np.int64, copy=False)


def _top_bits(vocab: int) -> int:
    """``P = 61 - bit_length(V)``."""
    return 61 - int(bit_length_np(np.array([vocab], dtype=np.int64))[0])


def _weights(rows: IntArray) -> tuple[IntArray, IntArray, int]:
    """``z`` (base-2 gaps at 2**-20), the weights ``2**(P - z)`` and ``P``."""
    top_bits = _top_bits(rows.shape[-1])
    gap = np.minimum(rows.max(axis=-1, keepdims=True) - rows, _MAX_GAP)
    z = (gap * LOG2E_FIXED + (1 << (_GAP_SHIFT - 1))) >> _GAP_SHIFT  # to the nearest 2**-20
    return z, exp2_neg_fine(z, top_bits), top_bits


def _counts(weights: IntArray, total: IntArray) -> IntArray:
    """``floor(p * ((T - V) / S)) + 1``: float64 elementwise, correctly rounded."""
    vocab = weights.shape[-1]
    ratio = float(TOTAL_FREQUENCY - vocab) / total.astype(np.float64)
    return np.floor(weights.astype(np.float64) * ratio).astype(np.int64) + 1


def integer_table(logits: npt.NDArray[np.integer]) -> IntegerTables:
    """The cumulative table (``[V + 1]``, 0 .. 2**32), the log2-probabilities (``[V]``) and
    the entropy (0-D) of one integer logit row."""
    tables = integer_tables(_checked(logits, 1)[None])
    return IntegerTables(tables.cumulative[0], tables.log2p[0], tables.entropy[0])


def integer_tables(logits: npt.NDArray[np.integer],
                   out: TableBuffers | None = None) -> IntegerTables:
    """The tables ``[R, V + 1]``, log2-probabilities ``[R, V]`` and entropies ``[R]`` of many
    rows at once; each row's are bit-identical to ``integer_table`` of that row. With ``out``,
    they are written into its first R rows and returned as views (native.c only; numpy
    allocates).

    NOTE: native.c computes the same tables (``seqkv_integer_tables``, asserted equal by
    tests/test_integer_native.py) where it builds: numpy's tables are a large share of a
    portable decode and encode, most of it in exp2_neg_fine's table lookups.
    """
    rows = np.ascontiguousarray(_checked(logits, 2))
    kernels = native.load()  # on torch's thread count (the caller pins it)
    if kernels is not None:
        return _native_tables(kernels, rows, out)
    return numpy_tables(rows)


class TableBuffers:
    """Reusable outputs of ``integer_tables`` for up to ``rows`` rows of ``vocab`` logits: a
    portable encoder builds 64 tables at a time, 25 MB of each array on SmolLM2, and fresh
    arrays cost their page faults every time (most of an encode's variance on a shared
    machine)."""

    def __init__(self, rows: int, vocab: int) -> None:
        self.cumulative = np.empty((rows, vocab + 1), dtype=np.int64)
        self.log2p = np.empty((rows, vocab), dtype=np.float64)


def _entropy(top_bits: int, total: IntArray, log2_total: FloatArray,
             weighted_gaps: FloatArray) -> FloatArray:
    """Invariant 4's entropy of each row: ``log2(S) - P + sum(p * z) / S / 2**20``, at least 0
    (the table-based log2 of S may fall 2e-7 bits short where one token holds all the mass)."""
    entropy = (log2_total - top_bits) + weighted_gaps * 2.0**-FINE_FRAC_BITS / total
    return np.maximum(entropy, 0.0).reshape(-1)


def _native_tables(kernels: native.NativeKernels, rows: IntArray, out: TableBuffers | None
                   ) -> IntegerTables:
    count, vocab = rows.shape
    top_bits = _top_bits(vocab)
    high, low = fine_tables()
    if out is not None and out.log2p.shape[0] >= count and out.log2p.shape[1] == vocab:
        log2p, cumulative = out.log2p[:count], out.cumulative[:count]
    else:
        log2p = np.empty(rows.shape, dtype=np.float64)
        cumulative = np.empty((count, vocab + 1), dtype=np.int64)
    total = np.empty((count, 1), dtype=np.int64)
    weighted_gaps = np.empty((count, 1), dtype=np.float64)
    status = kernels.call("seqkv_integer_tables", rows, count, vocab, top_bits, LOG2E_FIXED,
                          _GAP_SHIFT, _MAX_GAP, high, low, TOTAL_FREQUENCY, log2p, cumulative,
                          total, weighted_gaps, torch.get_num_threads())
    assert status == 0, "a table's most likely token got a count below 1"
    log2_total = log2_fine(total)
    # in place: numpy_tables' (top_bits - z * 2**-20) - log2(S), the same two roundings
    log2p -= log2_total
    return IntegerTables(cumulative, log2p,
                         _entropy(top_bits, total, log2_total, weighted_gaps))


def numpy_tables(rows: IntArray) -> IntegerTables:
    """``integer_tables`` in numpy: the statement native.c's tables are checked against."""
    z, weights, top_bits = _weights(rows)
    total = weights.sum(axis=-1, keepdims=True)  # exact: below V * 2**P < 2**62
    counts = _counts(weights, total)
    top = counts.argmax(axis=-1)
    picked = np.arange(counts.shape[0])
    counts[picked, top] += TOTAL_FREQUENCY - counts.sum(axis=-1)
    assert np.all(counts[picked, top] >= 1)
    cumulative = np.zeros((counts.shape[0], counts.shape[1] + 1), dtype=np.int64)
    np.cumsum(counts, axis=-1, out=cumulative[:, 1:])
    assert np.all(cumulative[:, -1] == TOTAL_FREQUENCY)
    log2_total = log2_fine(total)
    log2p = (top_bits - z * 2.0**-FINE_FRAC_BITS) - log2_total
    # the float64 products summed in numpy's order: native.c's sum to rounding, not to the bit
    weighted_gaps = (weights.astype(np.float64) * z.astype(np.float64)).sum(axis=-1,
                                                                            keepdims=True)
    return IntegerTables(cumulative, np.asarray(log2p, dtype=np.float64),
                         _entropy(top_bits, total, log2_total, weighted_gaps))


def cumulative_from_integer_logits(logits: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """The coder's cumulative table of one integer logit row."""
    return integer_table(logits).cumulative


def table_cost_bits(cumulative: npt.NDArray[np.int64], symbol: int) -> float:
    """``-log2(count / 2**32)`` of ``symbol`` under a table (for reports)."""
    count = int(cumulative[symbol + 1] - cumulative[symbol])
    return FREQUENCY_BITS - float(np.log2(count))

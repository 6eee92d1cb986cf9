"""Fixed-point frequency tables: how a next-token distribution becomes something a coder can use.

An arithmetic coder needs integer frequencies that encoder and decoder derive identically. This
module turns one row of logits into a cumulative table of ``2**FREQUENCY_BITS`` total counts.

Invariants:
1. Every symbol gets a frequency of at least 1, so any token can be coded (enforced).
2. The frequencies sum to exactly ``TOTAL_FREQUENCY`` (enforced, asserted).
3. The table is a pure function of the logits' bits on a given machine: float64 softmax in numpy,
   then floor (checked by the round-trip tests; assumed across machines only when the execution
   profile in the file matches, see ``seqkv.schedule``).
4. Quantizing costs at most ``-log2(1 - vocab/TOTAL_FREQUENCY)`` bits per token over the ideal
   ``-log2 p`` (about 1.7e-5 bits at a 49,152-token vocabulary): each frequency is at least
   ``p * (TOTAL_FREQUENCY - vocab)`` (enforced by construction; the code-length test asserts it).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from seqkv.limits import MAX_VOCAB

FREQUENCY_BITS = 32
TOTAL_FREQUENCY = 1 << FREQUENCY_BITS
# NOTE: 2**32 total counts keeps the quantization loss per token near 1e-5 bits for vocabularies up
# to a few hundred thousand; the coder's 64-bit interval (see arithmetic.py) leaves >= 2**30
# sub-interval width even for a count of 1.

CumulativeTable = npt.NDArray[np.int64]


def log_softmax_bits(logits: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """Base-2 log-probabilities of one row of logits, computed in float64."""
    z = logits.astype(np.float64)
    z = z - z.max()
    return np.asarray((z - np.log(np.exp(z).sum())) / np.log(2.0), dtype=np.float64)


def cumulative_from_logits(logits: npt.NDArray[np.floating]) -> CumulativeTable:
    """Cumulative frequency table (length vocab + 1, from 0 to TOTAL_FREQUENCY) of one logit row."""
    return table_and_log2p(logits)[0]


def table_and_log2p(
    logits: npt.NDArray[np.floating],
) -> tuple[CumulativeTable, npt.NDArray[np.float64]]:
    """The coder's table and the float log2-probabilities of one logit row, with one exp pass.

    The table is bit-identical to ``cumulative_from_logits``'s; the log2-probabilities to
    ``log_softmax_bits``'s.
    """
    z = logits.astype(np.float64)
    z = z - z.max()
    e = np.exp(z)
    total = e.sum()
    log2p = np.asarray((z - np.log(total)) / np.log(2.0), dtype=np.float64)
    return cumulative_from_probabilities(e / total), log2p


def cumulative_from_probabilities(probabilities: npt.NDArray[np.floating]) -> CumulativeTable:
    """Cumulative frequency table of a probability vector (non-negative, normalised here)."""
    p = np.asarray(probabilities, dtype=np.float64)
    vocab = p.shape[0]
    if p.ndim != 1 or not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"expected one probability row of 1..{MAX_VOCAB} entries, got {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("probabilities must be finite, non-negative and not all zero")
    p = p / p.sum()
    counts = np.floor(p * float(TOTAL_FREQUENCY - vocab)).astype(np.int64) + 1
    return _settled_cumulative(counts)


def _settled_cumulative(counts: npt.NDArray[np.int64]) -> CumulativeTable:
    """The cumulative table of ``counts`` (each >= 1) after settling their sum on the total.

    The floors leave a few counts unassigned (or, after rounding of a float sum, a few too many):
    they go to the most frequent symbol, whose count is far larger than the correction.
    """
    top = int(np.argmax(counts))
    counts[top] += TOTAL_FREQUENCY - int(counts.sum())
    assert counts[top] >= 1
    cumulative = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=cumulative[1:])
    assert int(cumulative[-1]) == TOTAL_FREQUENCY
    return cumulative


def uniform_distribution(vocab: int) -> tuple[CumulativeTable, npt.NDArray[np.float64]]:
    """The uniform table over ``vocab`` symbols and its log2-probabilities."""
    return uniform_cumulative(vocab), np.full(vocab, -np.log2(vocab), dtype=np.float64)


def uniform_cumulative(vocab: int) -> CumulativeTable:
    """The table of the uniform distribution over ``vocab`` symbols."""
    return cumulative_from_probabilities(np.ones(vocab, dtype=np.float64))


def symbol_cost_bits(cumulative: CumulativeTable, symbol: int) -> float:
    """Ideal cost in bits of ``symbol`` under the quantized table: -log2(count / total)."""
    count = int(cumulative[symbol + 1] - cumulative[symbol])
    return FREQUENCY_BITS - float(np.log2(count))


def cumulative_from_counts(counts: npt.NDArray[np.integer]) -> CumulativeTable:
    """Cumulative table of non-negative integer weights, in integer arithmetic only.

    No floating point is involved, so the table is the same on every machine: what the portable
    coding levels (``seqkv.coding.ngram``) need. Every symbol keeps a count of at least 1.
    """
    weights = np.asarray(counts, dtype=np.int64)
    vocab = weights.shape[0]
    if weights.ndim != 1 or not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"expected one count row of 1..{MAX_VOCAB} entries, got {weights.shape}")
    total = int(weights.sum())
    if np.any(weights < 0) or total <= 0 or total >= 1 << 30:
        raise ValueError("counts must be non-negative, not all zero and sum below 2**30")
    # weights * (T - V) < 2**30 * 2**32 fits in int64: exact floor(p * (T - V)).
    return _settled_cumulative((weights * (TOTAL_FREQUENCY - vocab)) // total + 1)

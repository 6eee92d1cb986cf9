"""One position's coding table in whatever form is cheapest, and the predictors that make them.

Motivation: an arithmetic coder needs, per position, a symbol's share ``[start, end)`` of
``TOTAL_FREQUENCY`` (to encode it) and the symbol whose share holds a target (to decode). A
model's logits give a dense cumulative array (``seqkv.coding.frequencies``); the model-free
levels' tables need not be materialized: the ``ngram`` level's differs from a constant floor
only at the tokens seen so far (``seqkv.coding.ngram.NgramTable``), so its decoder's work per
token follows the tokens seen, not the vocabulary.

Invariants:
1. A ``PositionTable`` is a partition of ``[0, TOTAL_FREQUENCY)`` into one non-empty share per
   symbol, in symbol order: ``locate(t)`` returns the symbol whose ``interval`` holds ``t``
   (checked against the dense cumulative array for every table kind:
   ``tests/test_coding_tables.py``).
2. A predictor's ``table`` depends only on the tokens ``update`` has seen (assumed of every
   predictor; enforced by the model-free loops, which update with each token before asking for
   the next table).
3. ``surprisal`` and ``entropy`` are figures for the trace, in float arithmetic; nothing coded
   depends on them.
4. This module imports neither torch nor transformers.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import numpy.typing as npt

from seqkv.coding.frequencies import FREQUENCY_BITS, CumulativeTable, uniform_distribution


class PositionTable(Protocol):
    """The coder's table for one position."""

    def interval(self, symbol: int) -> tuple[int, int]:
        """``symbol``'s share ``[start, end)`` of ``TOTAL_FREQUENCY`` (ValueError outside the
        vocabulary)."""
        ...

    def locate(self, target: int) -> tuple[int, int, int]:
        """The symbol whose share holds ``target`` (in ``[0, TOTAL_FREQUENCY)``), and that
        share's start and end."""
        ...

    def surprisal(self, symbol: int) -> float:
        """``-log2`` of ``symbol``'s probability before quantization, in bits."""
        ...

    def entropy(self) -> float:
        """The entropy of the distribution before quantization, in bits."""
        ...


class TokenPredictor(Protocol):
    """A model-free level's predictor: tables from the tokens seen so far."""

    def table(self) -> PositionTable:
        """The next position's table."""
        ...

    def update(self, token: int) -> None:
        """Append ``token`` to the history."""
        ...


def cost_bits(start: int, end: int) -> float:
    """The ideal cost in bits of a symbol whose share is ``[start, end)``: ``-log2`` of its
    quantized probability."""
    return FREQUENCY_BITS - math.log2(end - start)


class DenseTable:
    """A table held as its cumulative array and log2-probabilities (a ``Distribution``)."""

    __slots__ = ("_cumulative", "_entropy", "_log2p")

    def __init__(self, cumulative: CumulativeTable, log2p: npt.NDArray[np.float64]) -> None:
        self._cumulative = cumulative
        self._log2p = log2p
        self._entropy: float | None = None

    def interval(self, symbol: int) -> tuple[int, int]:
        cumulative = self._cumulative
        if not 0 <= symbol < cumulative.shape[0] - 1:
            raise ValueError(f"symbol {symbol} outside a table of {cumulative.shape[0] - 1}")
        return int(cumulative[symbol]), int(cumulative[symbol + 1])

    def locate(self, target: int) -> tuple[int, int, int]:
        cumulative = self._cumulative
        symbol = int(np.searchsorted(cumulative, target, side="right")) - 1
        return symbol, int(cumulative[symbol]), int(cumulative[symbol + 1])

    def surprisal(self, symbol: int) -> float:
        return -float(self._log2p[symbol])

    def entropy(self) -> float:
        # NOTE: computed once per table: the uniform table serves every position of a session
        if self._entropy is None:
            log2p = self._log2p
            # not np.dot: it wakes OpenBLAS threads (as ``TraceColumns.record``)
            self._entropy = -float((np.exp2(log2p) * log2p).sum())
        return self._entropy


class UniformPredictor:
    """The ``plain`` level's predictor: the uniform table at every position."""

    __slots__ = ("_table",)

    def __init__(self, vocab_size: int) -> None:
        self._table = DenseTable(*uniform_distribution(vocab_size))

    def table(self) -> DenseTable:
        return self._table

    def update(self, token: int) -> None:
        """The uniform table ignores the history."""

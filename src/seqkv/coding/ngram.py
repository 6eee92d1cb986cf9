"""A cheap adaptive token model: the ``ngram`` coding level's predictor.

Tokens coded under the transformer cost one forward per token to decode. This model predicts the
next token from counts of what followed the same one and two previous tokens earlier in the same
stream (and of all tokens so far), blended with fixed integer weights, and learns as it codes. It
needs no model probabilities, so its code decodes identically on any machine; the KV then comes
from one float prefill.

The weights are an engineering choice, not fitted: a seen order-2 context dominates, then order 1,
then the stream's unigram counts, with a floor of 1 for every token (measured on the sample text
at 11-12 bits/token vs 4.5 for the transformer and 15.6 for plain ids).

The coder's table is ``cumulative_from_counts(weights())`` (``distribution``, the reference).
A token never seen has the floor's weight 1, so that table differs from a constant count only at
the tokens seen so far: ``table`` computes those counts alone (``NgramTable``), and the rest in
closed form, so a position costs O(tokens seen), not O(vocabulary).

Invariants:
1. ``table`` depends only on the tokens ``update`` has seen, in integer arithmetic (enforced:
   no float enters the counts), so encoder and decoder tables are identical everywhere.
2. ``table`` is ``distribution``'s table, count for count: the same shares of
   ``TOTAL_FREQUENCY`` in the same order (checked by property tests against the reference,
   on both of its representations: ``tests/test_coding_tables.py``).
3. Every token has a non-zero count, so any sequence can be coded (enforced), and the weights
   sum below ``2**30`` for at most ``max_positions(vocab)`` tokens of history, as
   ``cumulative_from_counts`` needs (enforced: ValueError past it, as the reference raises).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict

import numpy as np
import numpy.typing as npt

from seqkv.coding.frequencies import TOTAL_FREQUENCY, cumulative_from_counts

_FLOOR, _UNIGRAM, _BIGRAM, _TRIGRAM = 1, 8, 512, 4096
# NOTE: a token adds at most this much weight: its unigram count, and a bigram and a trigram
# count that a later context may weigh.
_STEP_WEIGHT = _UNIGRAM + _BIGRAM + _TRIGRAM
_MAX_TOTAL = 1 << 30  # ``cumulative_from_counts``: the weights sum below it
# NOTE: up to this many distinct tokens seen, a table is computed with Python integers; past it
# with numpy arrays: some 20 numpy calls a table cost, in per-call overhead, what a Python loop
# over a few dozen tokens does (the crossover: ``benchmarks/model_free_decode.py``).
SMALL_SEEN = 64


# NOTE: what one table costs, in the units of ``seqkv.limits.MAX_MODEL_FREE_WORK``: a Python
# table PYTHON_TABLE_COST plus PYTHON_ENTRY_COST a token seen, a numpy table ARRAY_TABLE_COST
# (its some 20 numpy calls) plus ARRAY_ENTRY_COST a token seen, each with the coder's step and
# the model's update around it (calibrated, with margin, under load by
# ``benchmarks/model_free_decode.py``). At a vocabulary of 8,192 or more the caps then allow
# 8,192 tokens (8,192 x (16,384 + 2 x 8,192) = 2**28): SmolLM2's context, so that any file its
# encoder writes decodes without it.
PYTHON_TABLE_COST = 1536
PYTHON_ENTRY_COST = 128
ARRAY_TABLE_COST = 16384
ARRAY_ENTRY_COST = 2


def table_cost(seen: int) -> int:
    """An upper bound on the work of a table over ``seen`` tokens seen (or fewer)."""
    if seen <= SMALL_SEEN:
        return PYTHON_TABLE_COST + PYTHON_ENTRY_COST * seen
    return ARRAY_TABLE_COST + ARRAY_ENTRY_COST * seen


def max_positions(vocab_size: int) -> int:
    """The most tokens of history whose table this model can give: beyond it, the weights may
    sum to ``2**30`` (invariant 3)."""
    return (_MAX_TOTAL - 1 - vocab_size) // _STEP_WEIGHT


class NgramTable:
    """One position's table, sparse: ``symbols`` (sorted: the tokens seen, or token 0 before
    any) with their ``weights``; every other token has weight 1 and count ``floor_count``.
    ``symbols[j]``'s count is ``quotients[j] + 1``, plus ``remainder`` at ``top`` (the first
    largest count takes what the floors leave, as ``cumulative_from_counts`` settles it), and
    its share begins at ``starts[j]``. Lists up to ``SMALL_SEEN`` symbols, int64 arrays past
    it."""

    __slots__ = ("floor_count", "quotients", "remainder", "starts", "symbols", "top", "total",
                 "vocab_size", "weights")

    def __init__(self, vocab_size: int, symbols: list[int] | npt.NDArray[np.int64],
                 weights: list[int] | npt.NDArray[np.int64], total: int, floor_count: int,
                 quotients: list[int] | npt.NDArray[np.int64],
                 starts: list[int] | npt.NDArray[np.int64], top: int, remainder: int) -> None:
        self.vocab_size = vocab_size
        self.symbols = symbols
        self.weights = weights
        self.total = total
        self.floor_count = floor_count
        self.quotients = quotients
        self.starts = starts
        self.top = top
        self.remainder = remainder

    def _position(self, symbol: int) -> int:
        """How many of ``symbols`` are below ``symbol``."""
        symbols = self.symbols
        if isinstance(symbols, list):
            return bisect_left(symbols, symbol)
        return int(symbols.searchsorted(symbol))

    def _end(self, j: int) -> int:
        return (int(self.starts[j]) + int(self.quotients[j]) + 1
                + (self.remainder if j == self.top else 0))

    def interval(self, symbol: int) -> tuple[int, int]:
        if not 0 <= symbol < self.vocab_size:
            raise ValueError(f"symbol {symbol} outside a table of {self.vocab_size}")
        j = self._position(symbol)
        if j < len(self.symbols) and int(self.symbols[j]) == symbol:
            return int(self.starts[j]), self._end(j)
        # a floor token: after symbols[j - 1]'s share and the floor tokens between them
        start = (symbol * self.floor_count if j == 0 else
                 self._end(j - 1) + (symbol - int(self.symbols[j - 1]) - 1) * self.floor_count)
        return start, start + self.floor_count

    def locate(self, target: int) -> tuple[int, int, int]:
        starts = self.starts
        j = (bisect_right(starts, target) if isinstance(starts, list)
             else int(starts.searchsorted(target, "right"))) - 1
        floor = self.floor_count
        if j < 0:
            symbol = target // floor
            return symbol, symbol * floor, symbol * floor + floor
        end = self._end(j)
        if target < end:
            return int(self.symbols[j]), int(starts[j]), end
        skipped = (target - end) // floor
        start = end + skipped * floor
        return int(self.symbols[j]) + 1 + skipped, start, start + floor

    def surprisal(self, symbol: int) -> float:
        j = self._position(symbol)
        seen = j < len(self.symbols) and int(self.symbols[j]) == symbol
        return -math.log2((int(self.weights[j]) if seen else _FLOOR) / self.total)

    def entropy(self) -> float:
        total = self.total
        log_total = math.log2(total)
        weights = self.weights
        floors = self.vocab_size - len(self.symbols)
        if isinstance(weights, list):
            seen = math.fsum(w * (log_total - math.log2(w)) for w in weights)
        else:
            values = weights.astype(np.float64)
            seen = float((values * (log_total - np.log2(values))).sum())
        return (floors * log_total + seen) / total


class AdaptiveNgram:
    """Counts of tokens after each 1- and 2-token context of one stream, and overall.

    A table from ``table`` reads this model's state: use it before the next ``update``.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._unigram: dict[int, int] = {}
        self._bigram: dict[int, dict[int, int]] = defaultdict(dict)
        self._trigram: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
        # how often each token and each pair of tokens was followed (its followers' counts)
        self._followed: dict[int, int] = defaultdict(int)
        self._followed_pairs: dict[tuple[int, int], int] = defaultdict(int)
        self._history: list[int] = []
        # while at most SMALL_SEEN: the tokens seen (sorted), their unigram weights, and each
        # one's place in them
        self._seen: list[int] = []
        self._small_base: list[int] = []
        self._index: dict[int, int] = {}
        # past SMALL_SEEN (``_large`` of them): the first ``_large`` entries of buffers that
        # grow by doubling: the tokens seen (sorted), their unigram weights, how many tokens
        # not seen lie below each, and 0, 1, 2, ...
        self._large: int | None = None
        self._symbols = self._base = self._below = self._ranks = np.zeros(0, dtype=np.int64)

    def weights(self) -> npt.NDArray[np.int64]:
        """The integer weight of every token as the next one (the reference, dense)."""
        weights = np.full(self.vocab_size, _FLOOR, dtype=np.int64)
        for token, count in self._unigram.items():
            weights[token] += _UNIGRAM * count
        for followers, weight, _ in self._contexts():
            for token, count in followers.items():
                weights[token] += weight * count
        return weights

    def distribution(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """The coder's table for the next token as a dense cumulative array, and its
        log2-probabilities: the reference ``table`` is checked against."""
        weights = self.weights()
        log2p = np.log2(weights / weights.sum())
        return cumulative_from_counts(weights), log2p

    def table(self) -> NgramTable:
        """The next token's table (invariant 2)."""
        contexts = self._contexts()
        total = self.vocab_size + _UNIGRAM * len(self._history) + sum(
            weight * count for _, weight, count in contexts)
        if total >= _MAX_TOTAL:  # as ``cumulative_from_counts`` refuses it
            raise ValueError(f"ngram weights sum to {total:,}, not below 2**30: more history "
                             f"than {max_positions(self.vocab_size):,} tokens")
        if self._large is None:
            return self._small_table(contexts, total)
        return self._large_table(contexts, total)

    def _contexts(self) -> list[tuple[dict[int, int], int, int]]:
        """(followers, weight, their count) of the current 1- and 2-token contexts."""
        history = self._history
        out = []
        if history:
            followers = self._bigram.get(history[-1])
            if followers:
                out.append((followers, _BIGRAM, self._followed[history[-1]]))
        if len(history) >= 2:
            pair = (history[-2], history[-1])
            followers = self._trigram.get(pair)
            if followers:
                out.append((followers, _TRIGRAM, self._followed_pairs[pair]))
        return out

    def _small_table(self, contexts: list[tuple[dict[int, int], int, int]],
                     total: int) -> NgramTable:
        vocab = self.vocab_size
        if self._seen:
            symbols = self._seen
            weights = self._small_base.copy()
            index = self._index
            for followers, weight, _ in contexts:
                for token, count in followers.items():
                    weights[index[token]] += weight * count
        else:
            symbols, weights = [0], [_FLOOR]
        scale = TOTAL_FREQUENCY - vocab
        quotients = [w * scale // total for w in weights]
        floor = scale // total + 1
        seen = len(symbols)
        top = quotients.index(max(quotients))
        remainder = TOTAL_FREQUENCY - floor * (vocab - seen) - sum(quotients) - seen
        starts = []
        done = 0
        for j, symbol in enumerate(symbols):
            starts.append(floor * (symbol - j) + done + (remainder if j > top else 0))
            done += quotients[j] + 1
        return NgramTable(vocab, symbols, weights, total, floor, quotients, starts, top,
                          remainder)

    def _large_table(self, contexts: list[tuple[dict[int, int], int, int]],
                     total: int) -> NgramTable:
        vocab = self.vocab_size
        seen = self._large
        assert seen is not None
        symbols = self._symbols[:seen]
        weights = self._base[:seen].copy()
        for followers, weight, _ in contexts:
            tokens = np.fromiter(followers.keys(), np.int64, len(followers))
            counts = np.fromiter(followers.values(), np.int64, len(followers))
            weights[symbols.searchsorted(tokens)] += weight * counts
        scale = TOTAL_FREQUENCY - vocab
        # weights < 2**30 and scale < 2**32: the products fit in int64
        quotients = weights * scale
        quotients //= total
        floor = scale // total + 1
        top = int(quotients.argmax())
        remainder = TOTAL_FREQUENCY - floor * (vocab - seen) - int(quotients.sum()) - seen
        # starts[j]: the counts before symbols[j]: quotients + 1 each, a floor count for each
        # token not seen below it, and the remainder past the top
        starts = quotients.cumsum()
        starts -= quotients
        starts += floor * self._below[:seen] + self._ranks[:seen]
        starts[top + 1 :] += remainder
        return NgramTable(vocab, symbols, weights, total, floor, quotients, starts, top,
                          remainder)

    def update(self, token: int) -> None:
        history = self._history
        count = self._unigram.get(token, 0)
        self._unigram[token] = count + 1
        if self._large is not None:
            self._update_large(token, count)
        elif count:
            self._small_base[self._index[token]] += _UNIGRAM
        else:
            j = bisect_left(self._seen, token)
            self._seen.insert(j, token)
            self._small_base.insert(j, _FLOOR + _UNIGRAM)
            self._index = {s: i for i, s in enumerate(self._seen)}
            if len(self._seen) > SMALL_SEEN:
                self._to_large()
        if history:
            following = self._bigram[history[-1]]
            following[token] = following.get(token, 0) + 1
            self._followed[history[-1]] += 1
        if len(history) >= 2:
            pair = (history[-2], history[-1])
            following = self._trigram[pair]
            following[token] = following.get(token, 0) + 1
            self._followed_pairs[pair] += 1
        history.append(token)

    def _to_large(self) -> None:
        """Move the tokens seen from the lists to the arrays."""
        seen = len(self._seen)
        self._symbols = np.zeros(2 * seen, dtype=np.int64)
        self._base = np.zeros(2 * seen, dtype=np.int64)
        self._ranks = np.arange(2 * seen, dtype=np.int64)
        self._symbols[:seen] = self._seen
        self._base[:seen] = self._small_base
        self._below = self._symbols - self._ranks
        self._large = seen
        self._seen, self._small_base, self._index = [], [], {}

    def _update_large(self, token: int, count: int) -> None:
        seen = self._large
        assert seen is not None
        j = int(self._symbols[:seen].searchsorted(token))
        if count:
            self._base[j] += _UNIGRAM
            return
        if seen == self._symbols.shape[0]:  # full: double the buffers
            grown = 2 * seen
            self._symbols, self._base, self._below = (
                np.concatenate([array, np.zeros(grown - seen, dtype=np.int64)])
                for array in (self._symbols, self._base, self._below))
            self._ranks = np.arange(grown, dtype=np.int64)
        # NOTE: the shifts overlap; numpy copies overlapping slices as if through a buffer
        for array, value in ((self._symbols, token), (self._base, _FLOOR + _UNIGRAM),
                             (self._below, token - j)):
            array[j + 1 : seen + 1] = array[j:seen]
            array[j] = value
        self._below[j + 1 : seen + 1] -= 1
        self._large = seen + 1

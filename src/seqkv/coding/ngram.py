"""A cheap adaptive token model: the ``ngram`` coding level's predictor.

Tokens coded under the transformer cost one forward per token to decode. This model predicts the
next token from counts of what followed the same one and two previous tokens earlier in the same
stream (and of all tokens so far), blended with fixed integer weights, and learns as it codes. It
needs no model probabilities, so its code decodes identically on any machine; the KV then comes
from one float prefill.

The weights are an engineering choice, not fitted: a seen order-2 context dominates, then order 1,
then the stream's unigram counts, with a floor of 1 for every token (measured on the sample text
at 11-12 bits/token vs 4.5 for the transformer and 15.6 for plain ids).

Invariants:
1. ``table`` depends only on the tokens ``update`` has seen, in integer arithmetic (enforced:
   ``cumulative_from_counts``), so encoder and decoder tables are identical everywhere.
2. Every token has a non-zero count, so any sequence can be coded (enforced).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import numpy.typing as npt

from seqkv.coding.frequencies import CumulativeTable, cumulative_from_counts

_FLOOR, _UNIGRAM, _BIGRAM, _TRIGRAM = 1, 8, 512, 4096


class AdaptiveNgram:
    """Counts of tokens after each 1- and 2-token context of one stream, and overall."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._unigram = np.zeros(vocab_size, dtype=np.int64)
        self._bigram: dict[int, dict[int, int]] = defaultdict(dict)
        self._trigram: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
        self._history: list[int] = []

    def weights(self) -> npt.NDArray[np.int64]:
        """The integer weight of every token as the next one."""
        weights = _FLOOR + _UNIGRAM * self._unigram
        history = self._history
        if history:
            for token, count in self._bigram.get(history[-1], {}).items():
                weights[token] += _BIGRAM * count
        if len(history) >= 2:
            for token, count in self._trigram.get((history[-2], history[-1]), {}).items():
                weights[token] += _TRIGRAM * count
        return weights

    def table(self) -> tuple[CumulativeTable, npt.NDArray[np.float64]]:
        """The coder's table for the next token and its log2-probabilities."""
        weights = self.weights()
        log2p = np.log2(weights / weights.sum())
        return cumulative_from_counts(weights), log2p

    def update(self, token: int) -> None:
        history = self._history
        self._unigram[token] += 1
        if history:
            following = self._bigram[history[-1]]
            following[token] = following.get(token, 0) + 1
        if len(history) >= 2:
            following = self._trigram[(history[-2], history[-1])]
            following[token] = following.get(token, 0) + 1
        history.append(token)

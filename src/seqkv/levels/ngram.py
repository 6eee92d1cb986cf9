"""The ``ngram`` level: tokens under an adaptive integer count model, no model forward per token.

The predictor is ``seqkv.coding.ngram.AdaptiveNgram`` (order-2 counts of the session so far,
integer arithmetic), so the tokens decode on any machine without the model
(``seqkv.levels.model_free``); the KV comes from one float prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqkv.coding.arithmetic import least_symbol_bits
from seqkv.coding.frequencies import TOTAL_FREQUENCY
from seqkv.coding.ngram import AdaptiveNgram, max_positions, table_cost
from seqkv.levels.base import LevelSpec
from seqkv.levels.model_free import FORMER_KV_SCHEDULES, KV_SCHEDULE, ModelFreeLevel


@dataclass(frozen=True)
class NgramLevel(ModelFreeLevel):
    @property
    def spec(self) -> LevelSpec:
        return LevelSpec("ngram", model_coded=False, schedule=KV_SCHEDULE,
                         decoding="no model forward per token; one prefill for the KV",
                         former_schedules=FORMER_KV_SCHEDULES,
                         portable=True, reference="none")

    def predictor(self, vocab_size: int) -> AdaptiveNgram:
        return AdaptiveNgram(vocab_size)

    def least_symbol_bits(self, vocab_size: int) -> float:
        """Near 0: after a run of one token the model gives it all but the other tokens'
        floor counts (at least 1 each), so a token may take as little as
        ``-log2(1 - (V - 1) / 2**32)`` bits and only the level's caps bound a forged count."""
        return least_symbol_bits(TOTAL_FREQUENCY - vocab_size + 1)

    def decode_work(self, vocab_size: int, positions: int, count: int) -> int:
        """Per token, a table over the tokens seen so far (at most the vocabulary or the
        positions; ``seqkv.coding.ngram.table_cost``)."""
        return count * table_cost(min(vocab_size, positions))

    def max_positions(self, vocab_size: int) -> int:
        return max_positions(vocab_size)

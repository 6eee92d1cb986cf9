"""The ``ngram`` level: tokens under an adaptive integer count model, no model forward per token.

The predictor is ``seqkv.coding.ngram.AdaptiveNgram`` (order-2 counts of the session so far,
integer arithmetic), so the tokens decode on any machine without the model
(``seqkv.levels.model_free``); the KV comes from one float prefill.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from seqkv.coding.ngram import AdaptiveNgram
from seqkv.levels.base import Distribution, LevelSpec
from seqkv.levels.model_free import FORMER_KV_SCHEDULES, KV_SCHEDULE, ModelFreeLevel


@dataclass(frozen=True)
class NgramLevel(ModelFreeLevel):
    @property
    def spec(self) -> LevelSpec:
        return LevelSpec("ngram", model_coded=False, schedule=KV_SCHEDULE,
                         decoding="no model forward per token; one prefill for the KV",
                         former_schedules=FORMER_KV_SCHEDULES,
                         portable=True, reference="none")

    def tables(self, vocab_size: int, prefix_tokens: Sequence[int],
               tokens: Sequence[int]) -> Iterator[Distribution]:
        model = AdaptiveNgram(vocab_size)
        for token in prefix_tokens:
            model.update(token)
        position = 0
        while True:
            yield model.table()
            model.update(tokens[position])
            position += 1

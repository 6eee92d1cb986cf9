"""The ``plain`` level: tokens under the uniform distribution, log2 V bits each.

The floor of the dial: no predictor at all, so the tokens decode anywhere instantly
(``seqkv.levels.model_free``); the KV comes from one float prefill.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from seqkv.coding.frequencies import uniform_distribution
from seqkv.levels.base import Distribution, LevelSpec
from seqkv.levels.model_free import FORMER_KV_SCHEDULES, KV_SCHEDULE, ModelFreeLevel


@dataclass(frozen=True)
class PlainLevel(ModelFreeLevel):
    @property
    def spec(self) -> LevelSpec:
        return LevelSpec("plain", model_coded=False, schedule=KV_SCHEDULE,
                         decoding="no model forward per token; one prefill for the KV",
                         former_schedules=FORMER_KV_SCHEDULES,
                         portable=True, reference="uniform")

    def tables(self, vocab_size: int, prefix_tokens: Sequence[int],
               tokens: Sequence[int]) -> Iterator[Distribution]:
        uniform = uniform_distribution(vocab_size)
        while True:
            yield uniform

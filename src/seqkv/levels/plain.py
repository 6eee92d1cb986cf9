"""The ``plain`` level: tokens under the uniform distribution, log2 V bits each.

The floor of the dial: no predictor at all, so the tokens decode anywhere instantly
(``seqkv.levels.model_free``); the KV comes from one float prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqkv.coding.arithmetic import least_symbol_bits
from seqkv.coding.frequencies import uniform_cumulative
from seqkv.coding.ngram import PYTHON_TABLE_COST
from seqkv.coding.tables import UniformPredictor
from seqkv.levels.base import LevelSpec
from seqkv.levels.model_free import FORMER_KV_SCHEDULES, KV_SCHEDULE, ModelFreeLevel


@dataclass(frozen=True)
class PlainLevel(ModelFreeLevel):
    @property
    def spec(self) -> LevelSpec:
        return LevelSpec("plain", model_coded=False, schedule=KV_SCHEDULE,
                         decoding="no model forward per token; one prefill for the KV",
                         former_schedules=FORMER_KV_SCHEDULES,
                         portable=True, reference="uniform")

    def predictor(self, vocab_size: int) -> UniformPredictor:
        return UniformPredictor(vocab_size)

    def least_symbol_bits(self, vocab_size: int) -> float:
        """About ``log2 V``: the uniform table's largest count (the one that takes the
        rounding's remainder) bounds every token's."""
        return least_symbol_bits(int(np.diff(uniform_cumulative(vocab_size)).max()))

    def decode_work(self, vocab_size: int, positions: int, count: int) -> int:
        """One lookup a token in the one table (a binary search): a Python table's cost."""
        return count * PYTHON_TABLE_COST

"""The zero predictor: plain per-vector quantization of the KV cache.

Motivation: the baseline every other predictor must beat. With a zero prediction the residual
is the KV vector itself, so the delta coder reduces to the quantizer (plus entropy coding of its
codes).

Invariants:
1. ``predict`` returns zeros and runs no model (enforced: ``cost`` stays zero).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seqkv.delta.predictors.base import (
    ForwardCost,
    PredictionSession,
    PredictorContext,
    PredictorName,
    SequentialCheck,
    zeros_like_position,
)


class _NoneSession:
    def __init__(self, context: PredictorContext) -> None:
        self._zeros = zeros_like_position(context.model)
        self._check = SequentialCheck()

    def predict(self, position: int) -> torch.Tensor:
        self._check.predicted(position)
        return self._zeros.clone()

    def observe(self, position: int, decoded: torch.Tensor) -> None:
        self._check.observed(position)

    @property
    def cost(self) -> ForwardCost:
        return ForwardCost()


@dataclass(frozen=True)
class NoPrediction:
    """Predict zero: the residual is the KV itself.

    >>> NoPrediction().label
    'none'
    """

    @property
    def name(self) -> PredictorName:
        return "none"

    @property
    def label(self) -> str:
        return "none"

    @property
    def needs_tokens(self) -> bool:
        return False

    def start(self, context: PredictorContext) -> PredictionSession:
        return _NoneSession(context)

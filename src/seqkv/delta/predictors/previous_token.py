"""Previous-token delta with anchor groups (after CacheGen, arXiv 2310.07240).

Motivation: neighbouring tokens' KV vectors are correlated, so CacheGen codes each token as a
delta. Positions are split into groups of ``group_size``; the first position of a group (its
anchor) is predicted as zero and coded like plain quantization, the others as a delta against a
reference that the decoder already holds:

- ``reference="previous"`` (default): the decoded vector of the previous position (closed-loop
  DPCM; quantization error does not accumulate because the reference is the *decoded* value);
- ``reference="anchor"``: the decoded anchor of the group, CacheGen's layout, which lets a
  decoder rebuild a group's positions in parallel.

Invariants:
1. ``predict(i)`` uses decoded vectors only (enforced): anchors at ``i % group_size == 0``.
2. No model forwards (enforced: ``cost`` stays zero).

Deviations from CacheGen: no extra bits for anchors, one width per position for every layer
(CacheGen gives shallow layers more bins), and the codes are entropy-coded with one fitted
categorical per (layer, K/V, width) rather than per (layer, channel); CacheGen's KV is
per-token max-abs scaled, which here is the quantizer's business (int8 does exactly that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from seqkv.delta.predictors.base import (
    ForwardCost,
    PredictionSession,
    PredictorContext,
    PredictorName,
    SequentialCheck,
    zeros_like_position,
)
from seqkv.errors import DeltaConfigError

DeltaReference = Literal["previous", "anchor"]

DEFAULT_GROUP_SIZE = 16
"""Positions per anchor group. CacheGen's chunks are far longer; 16 bounds how far a reference
is from the vectors it predicts when ``reference="anchor"``."""


class _PreviousTokenSession:
    def __init__(self, context: PredictorContext, group_size: int,
                 reference: DeltaReference) -> None:
        self._zeros = zeros_like_position(context.model)
        self._group_size = group_size
        self._reference_mode = reference
        self._reference: torch.Tensor | None = None
        self._check = SequentialCheck()

    def predict(self, position: int) -> torch.Tensor:
        self._check.predicted(position)
        if position % self._group_size == 0 or self._reference is None:
            return self._zeros.clone()
        return self._reference.clone()

    def observe(self, position: int, decoded: torch.Tensor) -> None:
        self._check.observed(position)
        if self._reference_mode == "previous" or position % self._group_size == 0:
            self._reference = decoded.clone()

    @property
    def cost(self) -> ForwardCost:
        return ForwardCost()


@dataclass(frozen=True)
class PreviousToken:
    """Delta against the decoded previous position (or the group's anchor), anchors every
    ``group_size`` positions.

    >>> PreviousToken().label
    'previous-token (G=16)'
    """

    group_size: int = DEFAULT_GROUP_SIZE
    reference: DeltaReference = "previous"

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise DeltaConfigError(f"group_size must be positive, got {self.group_size}")
        if self.reference not in ("previous", "anchor"):
            raise DeltaConfigError(
                f"reference must be 'previous' or 'anchor', got {self.reference!r}"
            )

    @property
    def name(self) -> PredictorName:
        return "previous_token"

    @property
    def label(self) -> str:
        kind = "previous-token" if self.reference == "previous" else "anchor-delta"
        return f"{kind} (G={self.group_size})"

    @property
    def needs_tokens(self) -> bool:
        return False

    def start(self, context: PredictorContext) -> PredictionSession:
        return _PreviousTokenSession(context, self.group_size, self.reference)

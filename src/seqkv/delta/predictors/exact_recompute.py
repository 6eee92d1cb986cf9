"""Exact recompute: the KV the model computes from the tokens, one forward per token.

Motivation: a KV cache is a deterministic function of its tokens (Lemma 1 of arXiv
2604.15356), so the best possible predictor is the recomputation itself; it is seqkv's token
codec seen as a predictor. The residual is then only the numerical difference between the
schedule that made the stored cache (usually one prefill) and token-by-token recomputation
(~3e-5 on SmolLM2-135M, CPU). The decoder needs the tokens, which the delta coder stores with
the token codec and counts.

Invariants:
1. The prediction at ``i`` is the KV that token-by-token forwards over ``t_0..t_i`` write at
   ``i``: the decoder's schedule of ``seqkv.codec`` (enforced: one single-token forward per
   position on a growing ``DynamicCache``, run by the codec inside ``pinned_threads``).
2. Predictions do not depend on decoded vectors (enforced): quantization error never feeds back.
3. ``cost`` is ``T`` calls of one row each (enforced).

Deviation: the forwards run the decoder stack without the LM head (``base_model``): the KV does
not depend on it, so the token codec's decoder computes the same KV (assumed for any transformers
causal LM whose ``base_model`` owns the cache updates; checked bit for bit on a tiny random model
of every backbone family of ``seqkv.models.backbones`` by ``tests/test_delta_predictors.py``).

Why transformers' forward and not a ``Backbone`` driver: the prediction must be the token codec's
decoder's KV bit for bit, and that decoder steps transformers' forward; the calls use only its
architecture-neutral interface (``base_model``, a ``DynamicCache``), so every family runs here
unchanged.
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
    require_tokens,
)
from seqkv.models.adapter import CausalLM


def recompute_kv(model: CausalLM, tokens: list[int]) -> torch.Tensor:
    """KV of token-by-token forwards over ``tokens``: ``[layers, 2, kv_heads, T, head_dim]``, the
    tokens level's decoder KV (``CausalLM.stepped_kv``)."""
    return model.stepped_kv(tokens)


class _ExactSession:
    def __init__(self, context: PredictorContext) -> None:
        tokens = list(require_tokens(context, "exact-recompute"))
        self._kv = recompute_kv(context.model, tokens)  # [L, 2, H, T, D]
        self._cost = ForwardCost(len(tokens), len(tokens))
        self._check = SequentialCheck()

    def predict(self, position: int) -> torch.Tensor:
        self._check.predicted(position)
        return self._kv[:, :, :, position, :].clone()  # [L, 2, H, D]

    def observe(self, position: int, decoded: torch.Tensor) -> None:
        self._check.observed(position)

    @property
    def cost(self) -> ForwardCost:
        return self._cost


@dataclass(frozen=True)
class ExactRecompute:
    """Predict the token-by-token recomputation of the KV from the tokens.

    >>> ExactRecompute().needs_tokens
    True
    """

    @property
    def name(self) -> PredictorName:
        return "exact_recompute"

    @property
    def label(self) -> str:
        return "exact recompute"

    @property
    def needs_tokens(self) -> bool:
        return True

    def start(self, context: PredictorContext) -> PredictionSession:
        return _ExactSession(context)

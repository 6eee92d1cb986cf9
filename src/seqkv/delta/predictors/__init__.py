"""KV predictors for the delta coder, one per module behind :class:`Predictor`.

- :class:`NoPrediction` (``none``): plain quantization.
- :class:`PreviousToken` (``previous_token``): CacheGen-style delta with anchor groups.
- :class:`TopKExpectation` (``topk_expectation``): the paper's top-k expected KV.
- :class:`ExactRecompute` (``exact_recompute``): the token codec's recomputation.
"""

from seqkv.delta.predictors.base import (
    ForwardCost,
    PredictionSession,
    Predictor,
    PredictorContext,
    PredictorName,
)
from seqkv.delta.predictors.exact_recompute import ExactRecompute, recompute_kv
from seqkv.delta.predictors.none import NoPrediction
from seqkv.delta.predictors.previous_token import DeltaReference, PreviousToken
from seqkv.delta.predictors.topk_expectation import (
    TopKExpectation,
    candidate_mask,
    forward_candidates,
)

__all__ = [
    "DeltaReference",
    "ExactRecompute",
    "ForwardCost",
    "NoPrediction",
    "PredictionSession",
    "Predictor",
    "PredictorContext",
    "PredictorName",
    "PreviousToken",
    "TopKExpectation",
    "candidate_mask",
    "forward_candidates",
    "recompute_kv",
]

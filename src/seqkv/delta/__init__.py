"""Predictive delta coding of KV caches (layer 2 of arXiv 2604.15356) composed with the
per-vector quantizers.

- ``predictors/``: what a KV vector is predicted from (none, previous token, the paper's top-k
  expectation, exact recompute), one module each behind :class:`Predictor`.
- :mod:`~seqkv.delta.bit_allocation`: uniform widths, the paper's surprisal rule, fixed budget.
- :mod:`~seqkv.delta.residual_coder`: per-position quantization and entropy coding of the codes.
- :mod:`~seqkv.delta.delta_codec`: :func:`encode_delta` / :func:`decode_delta`.
- :mod:`~seqkv.delta.metrics`: KV, attention-output and next-token distortion.

Its rate-distortion sweep lives outside the package (``research.bench.sweep``,
``python -m research.bench quant``).
"""

from seqkv.delta.bit_allocation import AllocationMode, allocate_bits, fixed_budget, surprisal_rule
from seqkv.delta.delta_codec import (
    BitBreakdown,
    DeltaCode,
    DeltaConfig,
    DeltaDecodeResult,
    DeltaEncodeResult,
    SurprisalProfile,
    TokenStore,
    decode_delta,
    encode_delta,
    store_tokens,
    surprisal_bits,
)
from seqkv.delta.metrics import ContinuationReference, Distortion, build_reference, measure
from seqkv.delta.predictors import (
    ExactRecompute,
    ForwardCost,
    NoPrediction,
    Predictor,
    PreviousToken,
    TopKExpectation,
)

__all__ = [
    "AllocationMode",
    "BitBreakdown",
    "ContinuationReference",
    "DeltaCode",
    "DeltaConfig",
    "DeltaDecodeResult",
    "DeltaEncodeResult",
    "Distortion",
    "ExactRecompute",
    "ForwardCost",
    "NoPrediction",
    "Predictor",
    "PreviousToken",
    "SurprisalProfile",
    "TokenStore",
    "TopKExpectation",
    "allocate_bits",
    "build_reference",
    "decode_delta",
    "encode_delta",
    "fixed_budget",
    "measure",
    "store_tokens",
    "surprisal_bits",
    "surprisal_rule",
]

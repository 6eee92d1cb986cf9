"""The expected KV over a model's top-k next-token candidates: the torch reference and CPU path.

Motivation: a predictor that does not know the next token yet can still predict its KV as the
probability-weighted mean of the KV each of the ``k`` most likely tokens would produce:
``KVhat = sum_j (p_j / sum_i p_i) KV_j`` (arXiv 2604.15356, layer 2; the top-k predictor of
``seqkv.delta.predictors``). Renormalising over the ``k`` candidates makes the weights sum to
one.

Invariants:
1. The weights are normalised in float64 and rounded to float32 once; products and the sum over
   the ``k`` candidates are float32, in torch's order along the candidate axis (enforced). This
   is exactly the top-k predictor's own arithmetic, so ``expectation(top.values,
   written[..., :k, :])`` equals it bit for bit (checked:
   ``tests/test_kernels_topk_expectation.py``).
2. ``probs`` is ``[..., k]``, broadcastable to ``candidates.shape[:-1]``, non-negative with a
   positive sum per row; ``candidates`` is ``[..., k, D]`` (assumed here; checked by the op).
3. The result has the candidates' dtype (enforced).
"""

from __future__ import annotations

import torch


def weights(probs: torch.Tensor) -> torch.Tensor:
    """``p / sum(p)`` over the last dim, in float64, rounded to float32: ``[..., k]``."""
    wide = probs.to(torch.float64)
    return (wide / wide.sum(dim=-1, keepdim=True)).to(torch.float32)


def expectation(probs: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Weights ``[..., k]`` (broadcast) and candidates ``[..., k, D]`` to ``[..., D]``."""
    w = weights(probs.to(candidates.device)).unsqueeze(-1)  # [..., k, 1]
    out = (candidates.to(torch.float32) * w).sum(dim=-2)  # [..., D]
    return out.to(candidates.dtype)

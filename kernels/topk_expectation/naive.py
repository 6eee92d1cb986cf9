"""The expected KV over a model's top-k next-token candidates: the torch reference and CPU path.

Motivation: a predictor that does not know the next token yet can still predict its KV as the
probability-weighted mean of the KV each of the ``k`` most likely tokens would produce:
``KVhat = sum_j (p_j / sum_i p_i) KV_j``. The residual against that prediction is what the coder
then stores. Renormalising over the ``k`` candidates makes the weights sum to one.

Invariants:
1. Computed in float32 whatever the input dtypes; the result has the candidates' dtype
   (enforced).
2. ``probs`` is ``[N, k]``, non-negative with a positive sum per row; ``candidates`` is
   ``[N, k, D]`` (assumed here; checked by the op function).
"""

from __future__ import annotations

import torch


def expectation(probs: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """``[N, k]`` weights and ``[N, k, D]`` candidates to ``[N, D]``."""
    weights = probs.to(torch.float32)
    weights = weights / weights.sum(dim=-1, keepdim=True)  # [N, k]
    out = (weights.unsqueeze(-1) * candidates.to(torch.float32)).sum(dim=-2)  # [N, D]
    return out.to(candidates.dtype)

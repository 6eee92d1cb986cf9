"""Top-k expectation: ``KVhat = sum_j renormalised p_j * KV_j`` over each position's ``k``
candidate tokens (probs ``[N, k]``, candidate KV ``[N, k, D]`` -> ``[N, D]``; leading dims
beyond ``N`` are flattened and restored).

Motivation: a KV predictor for positions whose token is not yet decoded (see
:mod:`seqkv.kernels.topk_expectation.naive`); the op is a batched weighted mean and
memory-bound, so the kernel's job is to read the candidates once.

Invariants:
1. ``probs`` must be finite, non-negative, with a positive sum per row (enforced: ``ValueError``,
   one device synchronisation per call).
2. Both backends agree to float32 rounding (checked: ``tests/test_kernels_topk_expectation.py``).
"""

from __future__ import annotations

import torch

from ..dispatch import KernelBackend, resolve_backend
from . import naive

__all__ = ["topk_expectation"]

_KERNEL_MAX_K = 256


def topk_expectation(
    probs: torch.Tensor, candidates: torch.Tensor, *, backend: KernelBackend | None = None
) -> torch.Tensor:
    """Probability-weighted mean of candidates: ``[..., k]``, ``[..., k, D]`` -> ``[..., D]``.

    >>> p = torch.tensor([[3.0, 1.0]])
    >>> kv = torch.tensor([[[1.0, 0.0], [0.0, 4.0]]])
    >>> topk_expectation(p, kv, backend="torch")
    tensor([[0.7500, 1.0000]])
    """
    if candidates.dim() < 2 or probs.shape != candidates.shape[:-1]:
        raise ValueError(
            f"probs must be [..., k] and candidates [..., k, D] with the same leading dims; got "
            f"{tuple(probs.shape)} and {tuple(candidates.shape)}"
        )
    if not (probs.dtype.is_floating_point and candidates.dtype.is_floating_point):
        raise TypeError(f"expected floating-point tensors, got {probs.dtype}, {candidates.dtype}")
    k, dim = candidates.shape[-2], candidates.shape[-1]
    if k < 1:
        raise ValueError("need at least one candidate per position (k >= 1)")
    lead = candidates.shape[:-2]
    flat_probs = probs.reshape(-1, k)  # [N, k]
    flat_candidates = candidates.reshape(-1, k, dim)  # [N, k, D]
    if flat_probs.numel():
        p = flat_probs.to(torch.float32)
        if not bool((torch.isfinite(p) & (p >= 0)).all() & (p.sum(dim=-1) > 0).all()):
            raise ValueError(
                "probs must be finite and non-negative with a positive sum for every position"
            )
    unsupported = None if k <= _KERNEL_MAX_K else f"k={k} exceeds {_KERNEL_MAX_K} candidates"
    if resolve_backend(backend, probs, candidates, unsupported=unsupported) == "triton":
        from .triton import expectation as expectation_kernel

        out = expectation_kernel(flat_probs, flat_candidates)
    else:
        out = naive.expectation(flat_probs, flat_candidates)
    return out.reshape(*lead, dim)  # [..., D]

"""Top-k expectation: ``KVhat = sum_j renormalised p_j * KV_j`` over each position's ``k``
candidate tokens (probs ``[..., k]``, candidate KV ``[..., k, D]`` -> ``[..., D]``).

Motivation: the top-k predictor of ``seqkv.delta.predictors`` (arXiv 2604.15356, layer 2)
averages the KV its ``k`` candidate tokens wrote, weighted by their renormalised probabilities;
the op is a batched weighted mean and memory-bound, so the kernel's job is to read the
candidates once. The signature fits the predictor's data as it is: one probability vector
``[k]`` shared by every layer and head broadcasts against the candidates
``[layers, 2, kv_heads, k, head_dim]``.

Invariants:
1. ``probs`` must be finite, non-negative, with a positive sum per row, and broadcastable to
   ``candidates.shape[:-1]`` (enforced: ``InvalidTensorError``, one device synchronisation per
   call).
2. The reference is the predictor's own arithmetic bit for bit (``naive.py``, invariant 1); the
   kernel agrees with it to float32 rounding of a ``k``-term sum (checked:
   ``tests/test_kernels_topk_expectation.py``).
"""

from __future__ import annotations

import torch

from seqkv.errors import InvalidTensorDtypeError, InvalidTensorError

from ..dispatch import KernelBackend, resolve_backend
from . import naive

__all__ = ["topk_expectation"]

_KERNEL_MAX_K = 256


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    """Whether ``shape`` broadcasts to exactly ``target`` (torch's rules, right-aligned)."""
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(target), strict=False))


def topk_expectation(
    probs: torch.Tensor, candidates: torch.Tensor, *, backend: KernelBackend | None = None
) -> torch.Tensor:
    """Probability-weighted mean of candidates: ``[..., k]``, ``[..., k, D]`` -> ``[..., D]``.

    ``probs`` broadcasts against ``candidates.shape[:-1]`` (e.g. one ``[k]`` vector for every
    layer and head), and is moved to the candidates' device.

    >>> p = torch.tensor([[3.0, 1.0]])
    >>> kv = torch.tensor([[[1.0, 0.0], [0.0, 4.0]]])
    >>> topk_expectation(p, kv, backend="torch")
    tensor([[0.7500, 1.0000]])
    """
    if candidates.dim() < 2 or probs.dim() < 1 or probs.shape[-1] != candidates.shape[-2]:
        raise InvalidTensorError(
            f"probs must be [..., k] and candidates [..., k, D] with the same k; got "
            f"{tuple(probs.shape)} and {tuple(candidates.shape)}"
        )
    lead = candidates.shape[:-1]  # [..., k]
    if not _broadcasts_to(probs.shape, lead):
        raise InvalidTensorError(
            f"probs {tuple(probs.shape)} do not broadcast to the candidates' {tuple(lead)}"
        )
    if not (probs.dtype.is_floating_point and candidates.dtype.is_floating_point):
        raise InvalidTensorDtypeError(
            f"expected floating-point tensors, got {probs.dtype}, {candidates.dtype}"
        )
    k, dim = candidates.shape[-2], candidates.shape[-1]
    if k < 1:
        raise InvalidTensorError("need at least one candidate per position (k >= 1)")
    probs = probs.to(candidates.device)
    if probs.numel():
        p = probs.to(torch.float64)
        if not bool((torch.isfinite(p) & (p >= 0)).all() & (p.sum(dim=-1) > 0).all()):
            raise InvalidTensorError(
                "probs must be finite and non-negative with a positive sum for every position"
            )
    unsupported = None if k <= _KERNEL_MAX_K else f"k={k} exceeds {_KERNEL_MAX_K} candidates"
    if resolve_backend(backend, probs, candidates, unsupported=unsupported) == "triton":
        # NOTE: imported here, after dispatch chose Triton: importing seqkv.kernels must not
        # import triton (seqkv.kernels.dispatch, invariant 1).
        from . import triton as kernel

        flat_probs = probs.expand(lead).reshape(-1, k)  # [N, k] (a view when broadcast)
        flat_candidates = candidates.reshape(-1, k, dim)  # [N, k, D]
        out = kernel.expectation(flat_probs, flat_candidates)
        return out.reshape(*candidates.shape[:-2], dim)  # [..., D]
    return naive.expectation(probs, candidates)

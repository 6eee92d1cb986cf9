"""The top-k expectation as one Triton kernel: each program reads a tile of rows' weights once
and their ``k`` candidate vectors once, and writes the weighted mean.

Motivation: the reference materialises the ``[N, k, D]`` product in float32 before reducing it;
the kernel reduces in registers, so it moves only the inputs and the ``[N, D]`` result.

Invariants:
1. Agrees with ``naive.expectation`` to float32 rounding of a ``k``-term sum: the weights are
   normalised in float64 and rounded to float32 as in the reference, but the two sums (of the
   probabilities, of the weighted candidates) run in ``tl.sum``'s order (checked with stated
   tolerances in ``tests/test_kernels_topk_expectation.py``).
2. ``k <= 256`` (enforced by the op function, which falls back to the reference under "auto").
"""

from __future__ import annotations

import torch

from .._jit import ENABLE_FP_FUSION, cdiv, kernel, next_power_of_2, tl
from ..common.triton import downcast, upcast

_TILE_ELEMENTS = 4096
"""Elements of the ``[rows, k, dims]`` candidate tile one program holds."""


@kernel
def _expectation_kernel(
    probs_ptr: tl.tensor,
    candidates_ptr: tl.tensor,
    out_ptr: tl.tensor,
    n_rows: tl.int64,
    k: tl.int64,
    dim: tl.int64,
    p_stride_row: tl.int64,
    p_stride_k: tl.int64,
    c_stride_row: tl.int64,
    c_stride_k: tl.int64,
    c_stride_dim: tl.int64,
    o_stride_row: tl.int64,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
) -> None:
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [R]
    cand = tl.arange(0, BLOCK_K)  # [K]
    dims = tl.program_id(1).to(tl.int64) * BLOCK_DIM + tl.arange(0, BLOCK_DIM)  # [Dc]
    row_ok = rows < n_rows
    cand_ok = cand < k
    pmask = row_ok[:, None] & cand_ok[None, :]  # [R, K]
    probs = upcast(tl.load(probs_ptr + rows[:, None] * p_stride_row + cand[None, :] * p_stride_k,
                           mask=pmask, other=0.0), tl.float64)
    total = tl.sum(probs, axis=1)  # [R], float64
    # NOTE: float64 division with `/` is IEEE round-to-nearest on every backend.
    weights = (probs / tl.where(row_ok, total, 1.0)[:, None]).to(tl.float32)  # [R, K]
    cmask = pmask[:, :, None] & (dims < dim)[None, None, :]  # [R, K, Dc]
    cands = upcast(tl.load(candidates_ptr + rows[:, None, None] * c_stride_row
                           + cand[None, :, None] * c_stride_k + dims[None, None, :] * c_stride_dim,
                           mask=cmask, other=0.0), tl.float32)
    out = tl.sum(weights[:, :, None] * cands, axis=1)  # [R, Dc]
    tl.store(out_ptr + rows[:, None] * o_stride_row + dims[None, :],
             downcast(out, out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (dims < dim)[None, :])


def expectation(
    probs: torch.Tensor, candidates: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Kernel twin of ``naive.expectation``; ``out`` (``[N, D]``, contiguous) may be given."""
    n_rows, k, dim = candidates.shape
    if out is None:
        out = torch.empty(n_rows, dim, dtype=candidates.dtype, device=candidates.device)
    if out.numel() == 0:
        return out
    block_k = next_power_of_2(k)
    block_dim = min(next_power_of_2(dim), max(16, _TILE_ELEMENTS // block_k))
    block_rows = max(1, min(next_power_of_2(n_rows), _TILE_ELEMENTS // (block_k * block_dim)))
    _expectation_kernel[(cdiv(n_rows, block_rows), cdiv(dim, block_dim))](
        probs, candidates, out, n_rows, k, dim, *probs.stride(), *candidates.stride(),
        out.stride(0), BLOCK_ROWS=block_rows, BLOCK_K=block_k, BLOCK_DIM=block_dim,
        enable_fp_fusion=ENABLE_FP_FUSION,
    )
    return out

"""Batched cumulative frequency tables in one Triton kernel: one program per row of logits.

Motivation: the reference (``naive.py``) materialises several ``[N, V]`` float64 and int64
intermediates. The kernel streams each row of logits four times in blocks of ``BLOCK`` and keeps
only scalars between passes: (1) the maximum; (2) the softmax denominator, each block a pairwise
tree, block sums in order; (3) the sum of the counts and the first most frequent symbol; (4) the
counts again, the remainder added to that symbol, and a running cumulative sum written out. The
only full-size write is the int64 table itself.

Invariants:
1. Every floating-point step is ``naive.py``'s, in the same order: the same ``deterministic_exp``
   (constants read from the same float64 tensor), the same tree, IEEE float64 division, no FMA
   contraction; so tables equal the reference's (enforced by construction; checked:
   ``tests/test_kernels_frequencies.py`` under the interpreter, ``scripts/gpu_check.sh`` on a
   GPU).
2. Ties for the most frequent symbol go to the first (``tl.argmax`` with ``tie_break_left``
   within a block, a strict ``>`` across blocks), as ``torch.argmax`` and ``np.argmax`` do
   (enforced).
3. Each program writes all ``V + 1`` entries of its row (checked: sentinel-filled outputs).
"""

from __future__ import annotations

import torch

from seqkv.coding.frequencies import TOTAL_FREQUENCY

from .._jit import ENABLE_FP_FUSION, device, kernel, tl
from ..common.triton import tree_sum_rows, upcast
from .naive import FLOOR_ARGUMENT, MIN_EXPONENT, TAYLOR, exp_constants

_TOTAL = tl.constexpr(TOTAL_FREQUENCY)
_FLOOR_ARGUMENT = tl.constexpr(FLOOR_ARGUMENT)
_MIN_EXPONENT = tl.constexpr(MIN_EXPONENT)
_DEGREE = tl.constexpr(len(TAYLOR) - 1)


@device
def _deterministic_exp(z: tl.tensor, constants_ptr: tl.tensor) -> tl.tensor:
    """Kernel twin of ``naive.deterministic_exp`` (float64, ``z <= 0``)."""
    z = tl.maximum(z, _FLOOR_ARGUMENT)
    log2e = tl.load(constants_ptr)
    ln2_hi = tl.load(constants_ptr + 1)
    ln2_lo = tl.load(constants_ptr + 2)
    k = tl.floor(z * log2e + 0.5)
    r = (z - k * ln2_hi) - k * ln2_lo
    poly = tl.zeros_like(r) + tl.load(constants_ptr + 3 + _DEGREE)
    for i in tl.static_range(_DEGREE):
        poly = poly * r + tl.load(constants_ptr + 3 + (_DEGREE - 1 - i))
    k_int = k.to(tl.int64)
    usable = k_int >= _MIN_EXPONENT
    power = ((tl.where(usable, k_int, 0) + 1023) << 52).to(tl.float64, bitcast=True)  # 2**k
    return tl.where(usable, poly * power, 0.0)


@device
def _block_exp(row_ptr: tl.tensor, index: tl.tensor, vocab: tl.tensor, peak: tl.tensor,
               constants_ptr: tl.tensor) -> tl.tensor:
    """``exp(logit - peak)`` for one block of a row, 0 beyond the vocabulary."""
    valid = index < vocab
    x = upcast(tl.load(row_ptr + index, mask=valid, other=-float("inf")), tl.float64)
    return tl.where(valid, _deterministic_exp(x - peak, constants_ptr), 0.0)


@device
def _block_counts(row_ptr: tl.tensor, index: tl.tensor, vocab: tl.tensor, peak: tl.tensor,
                  total: tl.tensor, span: tl.tensor, constants_ptr: tl.tensor) -> tl.tensor:
    """``floor(p * (2**32 - V)) + 1`` for one block (int64), 0 beyond the vocabulary."""
    p = _block_exp(row_ptr, index, vocab, peak, constants_ptr) / total
    return tl.where(index < vocab, tl.floor(p * span).to(tl.int64) + 1, 0)


@kernel
def _tables_kernel(
    logits_ptr: tl.tensor,
    constants_ptr: tl.tensor,
    out_ptr: tl.tensor,
    vocab: tl.int64,
    row_stride: tl.int64,
    BLOCK: tl.constexpr,
    LOG2_BLOCK: tl.constexpr,
) -> None:
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    out_row = out_ptr + row * (vocab + 1)
    lane = tl.arange(0, BLOCK).to(tl.int64)
    peak = tl.full([], -float("inf"), tl.float64)
    for start in range(0, vocab, BLOCK):
        index = start + lane
        x = upcast(tl.load(row_ptr + index, mask=index < vocab, other=-float("inf")),
                   tl.float64)
        peak = tl.maximum(peak, tl.max(x, axis=0))
    total = tl.zeros([], tl.float64)
    for start in range(0, vocab, BLOCK):
        e = _block_exp(row_ptr, start + lane, vocab, peak, constants_ptr)
        block_sum = tree_sum_rows(tl.reshape(e, [1, BLOCK]), 1, BLOCK, LOG2_BLOCK)  # [1]
        total = total + tl.sum(block_sum, axis=0)
    # NOTE: float64 division with `/` is IEEE round-to-nearest on every backend.
    grand_total = tl.full([], _TOTAL, tl.int64)
    span = (grand_total - vocab).to(tl.float64)
    count_sum = tl.zeros([], tl.int64)
    best = tl.full([], -1, tl.int64)
    best_at = tl.zeros([], tl.int64)
    for start in range(0, vocab, BLOCK):
        counts = _block_counts(row_ptr, start + lane, vocab, peak, total, span, constants_ptr)
        count_sum = count_sum + tl.sum(counts, axis=0)
        block_best = tl.max(counts, axis=0)
        block_at = tl.argmax(counts, axis=0, tie_break_left=True).to(tl.int64)
        better = block_best > best
        best_at = tl.where(better, start + block_at, best_at)
        best = tl.where(better, block_best, best)
    remainder = grand_total - count_sum
    tl.store(out_row, tl.zeros([], tl.int64))
    carry = tl.zeros([], tl.int64)
    for start in range(0, vocab, BLOCK):
        index = start + lane
        counts = _block_counts(row_ptr, index, vocab, peak, total, span, constants_ptr)
        counts = counts + tl.where(index == best_at, remainder, 0)
        tl.store(out_row + 1 + index, tl.cumsum(counts, axis=0) + carry, mask=index < vocab)
        carry = carry + tl.sum(counts, axis=0)


def cumulative_tables(
    logits: torch.Tensor, block: int, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Kernel twin of ``naive.cumulative_tables``; ``out`` (``[N, V + 1]`` int64) may be given."""
    n_rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if out is None:
        out = torch.empty(n_rows, vocab + 1, dtype=torch.int64, device=logits.device)
    if n_rows:
        _tables_kernel[(n_rows,)](
            logits, exp_constants(logits.device), out, vocab, logits.stride(0),
            BLOCK=block, LOG2_BLOCK=block.bit_length() - 1, enable_fp_fusion=ENABLE_FP_FUSION,
        )
    return out

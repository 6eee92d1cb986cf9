"""Batched cumulative frequency tables from logits: the torch reference and CPU path.

Motivation: the token coder needs, for every position, an integer table of total ``2**32`` in
which every symbol has a count of at least 1 (:mod:`seqkv.coding.frequencies`). On a GPU the
logits for a whole batch of positions are already there; this computes all their tables at once
with the algorithm of ``seqkv.coding.frequencies``: softmax in float64, ``count = floor(p *
(2**32 - V)) + 1``, the remainder to ``2**32`` added to the first most frequent symbol.

Every floating-point step is pinned so that the kernel (``triton.py``) can reproduce it bit for
bit:

- ``exp`` is :func:`deterministic_exp`, a fixed polynomial of IEEE operations. Library ``exp``
  functions differ in the last bit between numpy, torch's CPU kernels and CUDA's libdevice (on
  this project's CPU, ``np.exp`` and ``torch.exp`` disagree on about 2% of float64 inputs).
- The softmax denominator is summed in blocks of ``block`` elements, each block as a pairwise
  tree (:func:`seqkv.kernels.common.naive.tree_sum`), the block sums left to right.

Invariants:
1. Every count is at least 1 and each table ends at exactly ``2**32`` (enforced by construction;
   checked: ``tests/test_kernels_frequencies.py``).
2. Kernel and reference tables are equal under Triton's interpreter (checked: same test).
3. Tables differ from :func:`seqkv.coding.frequencies.cumulative_from_logits` (numpy's exp,
   its summation order, and a second normalisation of ``p`` there) by at most one count for
   every symbol but the most frequent, which absorbs the difference (checked on 6 x 5,000
   random logits: same test). They are not interchangeable with them, and a table built on a
   GPU is not promised to equal one built on a CPU: although every step here is an IEEE
   operation in a fixed order, the ``.skv`` header's device class, which the decoder checks
   before decoding, is what keeps a GPU-built table from ever being decoded against a
   CPU-built one (assumed from the container, not re-checked here).
4. The table depends on ``block``; encoder and decoder must use the same (assumed).
5. ``exp`` is flushed to 0 below ``2**-1020`` (arguments under about -707): such a symbol's
   count is 1 either way, and the denominator is at least 1 (enforced by construction).
"""

from __future__ import annotations

import math

import torch

from seqkv.coding.frequencies import TOTAL_FREQUENCY

from ..common.naive import tree_sum

DEFAULT_BLOCK = 1024
"""Elements per block of the denominator's sum (a power of two); part of the algorithm."""

LOG2E = 1.4426950408889634
"""``1 / ln 2`` rounded to float64."""
LN2_HI = 6.93147180369123816490e-01
"""High part of ``ln 2`` with 21 trailing zero bits, so ``k * LN2_HI`` is exact for ``|k| < 2**11``
(the Cody-Waite split of fdlibm's ``exp``)."""
LN2_LO = 1.90821492927058770002e-10
"""``ln 2 - LN2_HI``."""
TAYLOR = tuple(1.0 / math.factorial(n) for n in range(14))
"""``1/n!`` for n = 0..13: on ``|r| <= ln(2)/2`` the degree-13 Taylor polynomial of ``e^r`` is
within 5e-18 relative, below float64 resolution."""
MIN_EXPONENT = -1020
"""Below ``2**MIN_EXPONENT`` the result is flushed to 0 (keeps every product a normal number)."""
FLOOR_ARGUMENT = -1000.0
"""Arguments are clamped to this first, so ``-inf`` logits give 0 without overflow."""


def exp_constants(device: torch.device | None = None) -> torch.Tensor:
    """``[LOG2E, LN2_HI, LN2_LO, 1/0!, ..., 1/13!]`` as float64: what the kernel reads."""
    return torch.tensor((LOG2E, LN2_HI, LN2_LO, *TAYLOR), dtype=torch.float64, device=device)


def deterministic_exp(z: torch.Tensor) -> torch.Tensor:
    """``e^z`` for float64 ``z <= 0`` from IEEE operations in a fixed order.

    ``z = k ln 2 + r`` with ``k = floor(z log2(e) + 1/2)``; ``e^r`` by Horner's rule on the
    Taylor coefficients; ``2**k`` assembled from its bits.

    >>> float(deterministic_exp(torch.tensor([0.0], dtype=torch.float64))[0])
    1.0
    """
    z = z.clamp_min(FLOOR_ARGUMENT)
    k = torch.floor(z * LOG2E + 0.5)
    r = (z - k * LN2_HI) - k * LN2_LO
    poly = torch.full_like(r, TAYLOR[-1])
    for coefficient in reversed(TAYLOR[:-1]):
        poly = poly * r + coefficient
    k_int = k.to(torch.int64)
    usable = k_int >= MIN_EXPONENT
    power = ((torch.where(usable, k_int, 0) + 1023) << 52).view(torch.float64)  # 2**k
    return torch.where(usable, poly * power, torch.zeros_like(poly))


def blocked_sum(values: torch.Tensor, block: int) -> torch.Tensor:
    """Row sums of ``[N, V]``: pairwise trees over blocks of ``block``, block sums in order."""
    n_rows, vocab = values.shape
    n_blocks = -(-vocab // block)
    padded = values.new_zeros(n_rows, n_blocks * block)
    padded[:, :vocab] = values
    partial = tree_sum(padded.reshape(n_rows, n_blocks, block))  # [N, n_blocks]
    total = values.new_zeros(n_rows)
    for j in range(n_blocks):
        total = total + partial[:, j]
    return total  # [N]


def cumulative_tables(logits: torch.Tensor, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """Logits ``[N, V]`` to int64 cumulative tables ``[N, V + 1]`` from 0 to ``2**32``."""
    n_rows, vocab = logits.shape
    x = logits.to(torch.float64)  # [N, V]
    z = x - x.amax(dim=-1, keepdim=True)
    e = deterministic_exp(z)
    total = blocked_sum(e, block)  # [N]
    p = e / total.unsqueeze(-1)
    counts = torch.floor(p * float(TOTAL_FREQUENCY - vocab)).to(torch.int64) + 1  # [N, V]
    top = counts.argmax(dim=-1, keepdim=True)  # [N, 1]: the first maximum
    remainder = TOTAL_FREQUENCY - counts.sum(dim=-1, keepdim=True)
    counts = counts.scatter_add(-1, top, remainder)
    table = torch.zeros(n_rows, vocab + 1, dtype=torch.int64, device=logits.device)
    table[:, 1:] = counts.cumsum(dim=-1)
    return table

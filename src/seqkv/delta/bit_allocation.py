"""Bits per token position for the residual quantizer: uniform, the paper's surprisal rule, and
a fixed-budget variant of it.

Motivation: arXiv 2604.15356 (layer 2) spends more bits on the residual of a surprising token,
where the prediction is expected to be poor: ``b_i = max(1, floor(b0 * h_i / hbar))`` with
``h_i = -log2 P(t_i | t_<i)`` and ``hbar`` the mean of ``h`` over the sequence. The rule does
not keep the mean at ``b0`` (the floor lowers it, heavy tails raise it), so rates are hard to
compare; the fixed-budget variant allocates exactly ``round(b0 * T)`` bits in total, as nearly
proportional to surprisal as the integer widths allow.

The encoder chooses the widths; the delta coder stores them as side information (3 bits per
position), so the decoder needs neither the model's probabilities nor the tokens to read them.

Invariants:
1. Every width is an integer in ``1..max_bits`` (enforced; TurboQuant's Lloyd-Max codebooks and
   the bit packer exist for 1..8 bits only, so ``max_bits <= 8``).
2. ``SURPRISAL_BUDGET`` widths sum to exactly ``round(b0 * T)`` (enforced; checked by
   hypothesis in ``tests/test_delta_bit_allocation.py``).
3. Both surprisal modes are monotone: ``h_i > h_j`` implies ``b_i >= b_j`` (checked by the same
   tests).
4. With ``hbar == 0`` (a model certain of every token) the surprisal modes fall back to ``b0``
   everywhere: the rule's ratio is undefined there (enforced).

Deviations from the paper:
- The paper's rule has no upper bound; here widths are clipped to ``max_bits`` (8).
- The paper allocates one width per token position for the whole KV vector; so does this
  module (no per-layer or per-head allocation, unlike CacheGen's deeper-layers-fewer-bits).
"""

from __future__ import annotations

import math
from enum import Enum

import numpy as np
import numpy.typing as npt

from seqkv.errors import DeltaConfigError
from seqkv.quantizers.bitpack import MAX_BITS, MIN_BITS

WIDTH_FIELD_BITS = 3
"""Stored size of one position's width: widths 1..8 fit in 3 bits."""

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_BISECTION_STEPS = 200
"""Bisection on the proportionality constant; 200 halvings reach float64 resolution."""


class AllocationMode(Enum):
    """How the residual's bits are spread over token positions."""

    UNIFORM = "uniform"
    """``b0`` bits at every position."""
    SURPRISAL = "surprisal"
    """The paper's rule ``max(1, floor(b0 * h_i / hbar))``, clipped to ``max_bits``."""
    SURPRISAL_BUDGET = "surprisal_budget"
    """Proportional to surprisal with exactly ``round(b0 * T)`` bits in total."""


def _check(surprisal: FloatArray, b0: int, max_bits: int) -> None:
    if not MIN_BITS <= max_bits <= MAX_BITS:
        raise DeltaConfigError(f"max_bits must be in {MIN_BITS}..{MAX_BITS}, got {max_bits}")
    if not MIN_BITS <= b0 <= max_bits:
        raise DeltaConfigError(
            f"the budget b0 must be an integer in {MIN_BITS}..{max_bits}, got {b0}"
        )
    if surprisal.ndim != 1 or surprisal.size == 0:
        raise DeltaConfigError(
            f"surprisal must be a non-empty 1-D array (one value per token), got shape "
            f"{surprisal.shape}"
        )
    if not bool(np.isfinite(surprisal).all()) or bool((surprisal < 0).any()):
        raise DeltaConfigError("surprisal must be finite and >= 0 (bits of -log2 P(t_i | t_<i))")


def surprisal_rule(surprisal: FloatArray, b0: int, max_bits: int = MAX_BITS) -> IntArray:
    """The paper's widths ``max(1, floor(b0 * h_i / hbar))``, clipped to ``max_bits``.

    >>> surprisal_rule(np.array([0.5, 1.0, 4.5]), b0=2).tolist()
    [1, 1, 4]
    """
    h = np.asarray(surprisal, dtype=np.float64)
    _check(h, b0, max_bits)
    mean = float(h.mean())
    if mean == 0.0:
        return np.full(h.shape, b0, dtype=np.int64)
    widths = np.floor(b0 * h / mean).astype(np.int64)
    return np.clip(widths, MIN_BITS, max_bits)


def fixed_budget(surprisal: FloatArray, b0: int, max_bits: int = MAX_BITS) -> IntArray:
    """Widths nearly proportional to surprisal that sum to exactly ``round(b0 * T)``.

    Finds ``c`` with ``sum(clip(c * h_i, 1, max_bits)) == round(b0 * T)`` by bisection, floors,
    and hands the remaining bits to the largest fractional parts (ties: higher surprisal first).

    >>> fixed_budget(np.array([0.5, 1.0, 4.5]), b0=2).tolist()
    [1, 1, 4]
    >>> int(fixed_budget(np.array([1.0, 2.0, 3.0, 10.0]), b0=3).sum())
    12
    """
    h = np.asarray(surprisal, dtype=np.float64)
    _check(h, b0, max_bits)
    count = h.size
    target = round(b0 * count)
    if float(h.max()) == 0.0:
        return np.full(h.shape, b0, dtype=np.int64)

    x = h / float(h.max())  # in [0, 1]: keeps c * x finite for any input scale

    def total(c: float) -> float:
        return float(np.clip(c * x, MIN_BITS, max_bits).sum())

    # total(high) == max_bits * count unless some x are below 1e-300 (those stay near 1 bit).
    low, high = 0.0, max_bits / max(float(x[x > 0].min()), 1e-300)
    for _ in range(_BISECTION_STEPS):
        middle = 0.5 * (low + high)
        if total(middle) < target:
            low = middle
        else:
            high = middle
    ideal = np.clip(high * x, MIN_BITS, max_bits)
    widths = np.floor(ideal).astype(np.int64)
    fraction = ideal - widths
    remaining = target - int(widths.sum())
    # Largest fraction first, then higher surprisal, then earlier position; the reverse to take
    # bits back. Repeated passes only happen when inputs differ by more than 1e300.
    grow = np.lexsort((np.arange(count), -h, -fraction))
    shrink = np.lexsort((np.arange(count), h, fraction))
    while remaining > 0:
        eligible = grow[widths[grow] < max_bits][:remaining]
        widths[eligible] += 1
        remaining -= eligible.size
    while remaining < 0:
        eligible = shrink[widths[shrink] > MIN_BITS][:-remaining]
        widths[eligible] -= 1
        remaining += eligible.size
    return widths


def allocate_bits(
    mode: AllocationMode,
    b0: int,
    num_tokens: int,
    surprisal: FloatArray | None = None,
    max_bits: int = MAX_BITS,
) -> IntArray:
    """Widths for ``num_tokens`` positions; the surprisal modes need ``surprisal`` (bits).

    >>> allocate_bits(AllocationMode.UNIFORM, 3, 4).tolist()
    [3, 3, 3, 3]
    """
    if num_tokens < 1:
        raise DeltaConfigError(f"num_tokens must be positive, got {num_tokens}")
    if mode is AllocationMode.UNIFORM:
        _check(np.zeros(num_tokens), b0, max_bits)
        return np.full(num_tokens, b0, dtype=np.int64)
    if surprisal is None:
        raise DeltaConfigError(
            f"allocation {mode.value!r} needs the per-token surprisal; pass surprisal= "
            "(e.g. seqkv.delta.delta_codec.surprisal_bits(model, tokens))"
        )
    if len(surprisal) != num_tokens:
        raise DeltaConfigError(f"got {len(surprisal)} surprisal values for {num_tokens} tokens")
    if mode is AllocationMode.SURPRISAL:
        return surprisal_rule(surprisal, b0, max_bits)
    return fixed_budget(surprisal, b0, max_bits)


def width_bits(num_tokens: int) -> int:
    """Side information the stored widths cost: ``WIDTH_FIELD_BITS`` per position."""
    return WIDTH_FIELD_BITS * num_tokens


def mean_width(widths: IntArray) -> float:
    """Mean bits per component of the payload's nominal widths."""
    return float(widths.mean()) if widths.size else math.nan

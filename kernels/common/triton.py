"""Triton device functions shared by the kernels; each mirrors a torch expression exactly.

Motivation: see :mod:`seqkv.kernels.common.naive`. These helpers are the kernel-side halves: a
fixed-order tree reduction, the Walsh-Hadamard butterfly, packing of eight ``b``-bit codes into
``b`` bytes (the format of :mod:`seqkv.kernels.common.bitpack`), round-half-to-even, and directed
rounding of float32 values to float16.

Invariants:
1. Every floating-point result is a fixed sequence of IEEE operations (add, subtract, multiply,
   divide with ``div_rn``, ``floor``); launches disable FMA contraction (``ENABLE_FP_FUSION``), so
   a result equals its torch mirror bit for bit on every backend (enforced by construction;
   checked: each op's kernel-vs-reference test under the interpreter, and on a GPU by
   ``scripts/gpu_check.sh``).
2. :func:`round_half_even` needs ``|v| < 2**22`` for float32 and ``< 2**51`` for float64
   (assumed: callers clamp first).
3. :func:`fp16_round_down` / :func:`fp16_round_up` return float32 values that float16 holds
   exactly (so the final conversion does not round), or ``+-inf`` when ``|v|`` exceeds the
   float16 range, which the caller reports as an error (enforced).
4. bfloat16 is widened and narrowed by bit manipulation (:func:`upcast`, :func:`downcast`),
   exactly as torch does (widening is exact; narrowing rounds to nearest even). NOTE: Triton's
   CPU interpreter (3.9) converts bfloat16 itself through a float emulation that flushes
   subnormal inputs to zero and truncates instead of rounding (measured); the GPU backends are
   exact. Doing it by hand makes all backends agree (enforced).
"""

from __future__ import annotations

from .._jit import device, tl


@device
def tree_sum_rows(x: tl.tensor, ROWS: tl.constexpr, WIDTH: tl.constexpr,
                  LOG2_WIDTH: tl.constexpr) -> tl.tensor:
    """``[ROWS, WIDTH] -> [ROWS]``: adjacent pairs summed level by level (``naive.tree_sum``)."""
    for level in tl.static_range(LOG2_WIDTH):
        pairs = tl.reshape(x, [ROWS, WIDTH >> (level + 1), 2])  # [R, W / 2^(level+1), 2]
        left, right = tl.split(pairs)
        x = left + right
    return tl.reshape(x, [ROWS])  # [R]


@device
def butterfly_rows(x: tl.tensor, ROWS: tl.constexpr, DIM: tl.constexpr,
                   LOG2_DIM: tl.constexpr) -> tl.tensor:
    """Unnormalised Walsh-Hadamard transform of each row ``[ROWS, DIM]`` (``naive.butterfly``)."""
    for stage in tl.static_range(LOG2_DIM):
        half: tl.constexpr = 1 << stage
        quad = tl.reshape(x, [ROWS, DIM // (2 * half), 2, half])  # [R, D / 2h, 2, h]
        quad = tl.permute(quad, (0, 1, 3, 2))  # [R, D / 2h, h, 2]
        a, b = tl.split(quad)  # [R, D / 2h, h] each
        quad = tl.join(a + b, a - b)  # [R, D / 2h, h, 2]
        quad = tl.permute(quad, (0, 1, 3, 2))  # [R, D / 2h, 2, h]
        x = tl.reshape(quad, [ROWS, DIM])  # [R, D]
    return x


@device
def pack_words(codes: tl.tensor, BITS: tl.constexpr) -> tl.tensor:
    """Eight ``BITS``-bit codes per row ``[W, 8]`` (int64) to their ``BITS`` bytes ``[W, 8]``.

    Lanes ``k >= BITS`` of the result are not bytes of the word; the caller masks them.
    NOTE: the shifted codes occupy disjoint bits, so their integer sum is their bitwise OR.
    """
    lane = tl.arange(0, 8).to(tl.int64)
    word = tl.sum(codes << (lane * BITS)[None, :], axis=1)  # [W], 8 * BITS <= 64 bits
    return (word[:, None] >> (lane * 8)[None, :]) & 0xFF  # [W, 8]


@device
def unpack_words(octets: tl.tensor, BITS: tl.constexpr) -> tl.tensor:
    """Inverse of :func:`pack_words`: bytes ``[W, 8]`` (0 beyond ``BITS``) to codes ``[W, 8]``."""
    lane = tl.arange(0, 8).to(tl.int64)
    word = tl.sum(octets << (lane * 8)[None, :], axis=1)  # [W]
    return (word[:, None] >> (lane * BITS)[None, :]) & ((1 << BITS) - 1)  # [W, 8]


@device
def round_half_even(v: tl.tensor) -> tl.tensor:
    """``torch.round`` (ties to even) from exact operations, for float32 or float64 ``v``."""
    below = tl.floor(v)
    frac = v - below
    half = below * 0.5
    odd = half != tl.floor(half)
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return below + tl.where(up, 1.0, 0.0).to(v.dtype)


@device
def _fp16_quantum(v: tl.tensor) -> tuple[tl.tensor, tl.tensor]:
    """``(q, 1 / q)``: the float16 spacing at float32 ``v`` (``2^-24`` below ``2^-14``)."""
    exponent = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, -14)
    quantum = ((exponent - 10 + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((10 - exponent + 127) << 23).to(tl.float32, bitcast=True)
    return quantum, inverse


@device
def _fp16_overflow(v: tl.tensor, rounded: tl.tensor) -> tl.tensor:
    """``rounded``, or ``inf`` with ``v``'s sign where ``|v|`` exceeds the float16 maximum."""
    sign = (v.to(tl.int32, bitcast=True) >> 31) << 31
    infinity = (sign | 0x7F800000).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(v) > 65504.0, infinity, rounded)


@device
def fp16_round_down(v: tl.tensor) -> tl.tensor:
    """The largest float16 ``<= v`` (as float32), like ``naive.round_down_fp16``."""
    quantum, inverse = _fp16_quantum(v)
    return _fp16_overflow(v, tl.floor(v * inverse) * quantum)


@device
def fp16_round_up(v: tl.tensor) -> tl.tensor:
    """The smallest float16 ``>= v`` (as float32), like ``naive.round_up_fp16``."""
    quantum, inverse = _fp16_quantum(v)
    return _fp16_overflow(v, -tl.floor(-v * inverse) * quantum)


@device
def upcast(x: tl.tensor, dtype: tl.constexpr) -> tl.tensor:
    """Widen a loaded tensor to float32 or float64 exactly (bfloat16 through its bits)."""
    if x.dtype == tl.bfloat16:
        x = (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(dtype)


@device
def downcast(v: tl.tensor, dtype: tl.constexpr) -> tl.tensor:
    """Narrow float32 ``v`` to ``dtype``, rounding to nearest even (finite ``v``)."""
    if dtype == tl.bfloat16:
        bits = v.to(tl.int32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return v.to(dtype)

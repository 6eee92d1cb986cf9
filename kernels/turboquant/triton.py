"""TurboQuant_mse, randomized Hadamard variant: one fused Triton kernel each way.

Motivation: the torch reference (``naive.py``) makes about ten passes over the data (norm,
divide, signs, log2(d) butterfly stages, bucketize, pack). Here one program loads a tile of
``BLOCK_ROWS`` vectors once, keeps it in registers through normalisation, rotation, Lloyd-Max
bucketing (a binary search over the thresholds) and bit packing, and writes only the packed
bytes and one float32 norm per vector; decoding is the mirror image. Both are memory-bound.

Layout: a vector of ``D`` codes of ``b`` bits packs into ``D * b / 8`` whole bytes when
``D >= 8`` (``D`` is a power of two), so vector ``n`` owns bytes ``[n D b / 8, (n + 1) D b / 8)``
of the stream :func:`seqkv.quantizers.pack_bits` would write for the whole tensor.

Invariants:
1. Codes and packed bytes equal ``naive.encode``'s exactly: same codebook thresholds and signs
   (read from the quantizer), same IEEE operations in the same order, no FMA contraction
   (enforced by construction; checked: ``tests/test_kernels_turboquant.py``).
2. ``D`` is a power of two with ``8 <= D <= 1024``: eight codes fill whole bytes, and a tile
   keeps whole vectors in registers (checked by the op function, which falls back to the
   reference under ``"auto"``).
3. Every output element is written exactly once (checked: outputs are pre-filled with sentinels
   in the tests).
"""

from __future__ import annotations

import torch

from .._jit import ENABLE_FP_FUSION, cdiv, kernel, tl
from ..common.triton import (
    butterfly_rows,
    downcast,
    pack_words,
    tree_sum_rows,
    unpack_words,
    upcast,
)
from .naive import TINY, inverse_sqrt_dim

_TILE_ELEMENTS = 2048
"""Elements per program: ``BLOCK_ROWS = _TILE_ELEMENTS / D`` vectors."""


_TINY = tl.constexpr(TINY)
"""Triton kernels read only ``constexpr`` globals."""


def _block_rows(dim: int) -> int:
    return max(1, _TILE_ELEMENTS // dim)


@kernel
def _encode_kernel(
    x_ptr: tl.tensor,
    signs_ptr: tl.tensor,
    thresholds_ptr: tl.tensor,
    packed_ptr: tl.tensor,
    norms_ptr: tl.tensor,
    n_rows: tl.int64,
    row_stride: tl.int64,
    inv_sqrt_dim: float,
    DIM: tl.constexpr,
    LOG2_DIM: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
) -> None:
    first = tl.program_id(0).to(tl.int64) * BLOCK_ROWS
    rows = first + tl.arange(0, BLOCK_ROWS).to(tl.int64)  # [R]
    cols = tl.arange(0, DIM)  # [D]
    row_ok = rows < n_rows
    x = upcast(tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :],
                       mask=row_ok[:, None], other=0.0), tl.float32)  # [R, D]
    norms = tl.sqrt_rn(tree_sum_rows(x * x, BLOCK_ROWS, DIM, LOG2_DIM))  # [R]
    unit = tl.div_rn(x, tl.maximum(norms, _TINY)[:, None])  # [R, D]
    signs = tl.load(signs_ptr + cols)  # [D]
    rotated = butterfly_rows(unit * signs[None, :], BLOCK_ROWS, DIM, LOG2_DIM) * inv_sqrt_dim
    # Binary search for the number of thresholds below each value (torch.bucketize).
    codes = tl.zeros([BLOCK_ROWS, DIM], dtype=tl.int32)
    for step in tl.static_range(BITS):
        candidate = codes + (1 << (BITS - 1 - step))
        threshold = tl.load(thresholds_ptr + candidate - 1)  # [R, D]
        codes = tl.where(rotated > threshold, candidate, codes)
    words = tl.reshape(codes.to(tl.int64), [BLOCK_ROWS * DIM // 8, 8])  # [R * D / 8, 8]
    octets = pack_words(words, BITS)  # [R * D / 8, 8]
    word = first * (DIM // 8) + tl.arange(0, BLOCK_ROWS * DIM // 8).to(tl.int64)  # [R * D / 8]
    lane = tl.arange(0, 8)
    word_ok = word < n_rows * (DIM // 8)
    tl.store(packed_ptr + word[:, None] * BITS + lane[None, :], octets.to(tl.uint8),
             mask=word_ok[:, None] & (lane[None, :] < BITS))
    tl.store(norms_ptr + rows, norms, mask=row_ok)


@kernel
def _decode_kernel(
    packed_ptr: tl.tensor,
    norms_ptr: tl.tensor,
    signs_ptr: tl.tensor,
    levels_ptr: tl.tensor,
    out_ptr: tl.tensor,
    n_rows: tl.int64,
    inv_sqrt_dim: float,
    DIM: tl.constexpr,
    LOG2_DIM: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
) -> None:
    first = tl.program_id(0).to(tl.int64) * BLOCK_ROWS
    word = first * (DIM // 8) + tl.arange(0, BLOCK_ROWS * DIM // 8).to(tl.int64)  # [R * D / 8]
    lane = tl.arange(0, 8)
    word_ok = word < n_rows * (DIM // 8)
    octets = tl.load(packed_ptr + word[:, None] * BITS + lane[None, :],
                     mask=word_ok[:, None] & (lane[None, :] < BITS), other=0).to(tl.int64)
    codes = tl.reshape(unpack_words(octets, BITS), [BLOCK_ROWS, DIM])  # [R, D]
    rows = first + tl.arange(0, BLOCK_ROWS).to(tl.int64)  # [R]
    cols = tl.arange(0, DIM)  # [D]
    row_ok = rows < n_rows
    values = tl.load(levels_ptr + codes)  # [R, D]
    signs = tl.load(signs_ptr + cols)  # [D]
    unit = butterfly_rows(values, BLOCK_ROWS, DIM, LOG2_DIM) * inv_sqrt_dim * signs[None, :]
    norms = tl.load(norms_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)  # [R]
    out = unit * norms[:, None]
    tl.store(out_ptr + rows[:, None] * DIM + cols[None, :], downcast(out, out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def encode(
    x: torch.Tensor,
    signs: torch.Tensor,
    thresholds: torch.Tensor,
    bits: int,
    *,
    packed: torch.Tensor | None = None,
    norms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of ``naive.encode``; ``packed`` / ``norms`` may be given pre-allocated."""
    n_rows, dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if packed is None:
        packed = torch.empty(n_rows * dim * bits // 8, dtype=torch.uint8, device=x.device)
    if norms is None:
        norms = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows:
        block_rows = _block_rows(dim)
        _encode_kernel[(cdiv(n_rows, block_rows),)](
            x, signs, thresholds, packed, norms, n_rows, x.stride(0), inverse_sqrt_dim(dim),
            DIM=dim, LOG2_DIM=dim.bit_length() - 1, BITS=bits, BLOCK_ROWS=block_rows,
            enable_fp_fusion=ENABLE_FP_FUSION,
        )
    return packed, norms


def decode(
    packed: torch.Tensor,
    norms: torch.Tensor,
    signs: torch.Tensor,
    levels: torch.Tensor,
    bits: int,
    dtype: torch.dtype,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Kernel twin of ``naive.decode``; ``out`` (``[N, D]``, contiguous) may be pre-allocated."""
    n_rows, dim = norms.shape[0], signs.shape[0]
    if out is None:
        out = torch.empty(n_rows, dim, dtype=dtype, device=packed.device)
    if n_rows:
        block_rows = _block_rows(dim)
        _decode_kernel[(cdiv(n_rows, block_rows),)](
            packed, norms, signs, levels, out, n_rows, inverse_sqrt_dim(dim),
            DIM=dim, LOG2_DIM=dim.bit_length() - 1, BITS=bits, BLOCK_ROWS=block_rows,
            enable_fp_fusion=ENABLE_FP_FUSION,
        )
    return out

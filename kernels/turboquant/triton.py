"""TurboQuant_mse: one fused Triton kernel each way, for either rotation.

Motivation: the torch reference (``naive.py``) makes about ten passes over the data (norm,
divide, rotation, bucketize, pack). Here one program loads a tile of ``BLOCK_ROWS`` vectors
once, keeps it in registers through normalisation, rotation, Lloyd-Max bucketing (a binary
search over the thresholds) and bit packing, and writes only the packed bytes and one float32
norm per vector; decoding is the mirror image. The rotation is a constexpr switch: the
randomized Hadamard butterfly (``HADAMARD``), or a ``tl.dot`` with the ``[D, D]`` orthogonal
matrix in full float32 (``input_precision="ieee"``: no TF32). The Hadamard variant is
memory-bound; the orthogonal one does ``D`` multiply-adds per element on float32 units, so at
``D = 128`` it is expected to be bound by arithmetic instead (an estimate: no GPU was available
to measure it; ``benchmarks/gpu_kernels.py`` reports it).

Layout: a vector of ``D`` codes of ``b`` bits packs into ``D * b / 8`` whole bytes when
``D >= 8`` (``D`` is a power of two), so vector ``n`` owns bytes ``[n D b / 8, (n + 1) D b / 8)``
of the stream :func:`seqkv.kernels.common.bitpack.pack_bits` would write for the whole tensor.

Invariants:
1. Hadamard: codes and packed bytes equal ``naive.encode``'s exactly: same codebook thresholds
   and signs, same IEEE operations in the same order, no FMA contraction (enforced by
   construction; checked: ``tests/test_kernels_turboquant.py``). Orthogonal: norms equal
   exactly; the dot product's summation order is the library's, so a code may differ where a
   rotated coordinate is within float32 rounding of a threshold (checked: the same tests).
2. ``D`` is a power of two with ``8 <= D <= 1024`` (Hadamard) or ``16 <= D <= 128`` (orthogonal:
   ``tl.dot`` needs 16, and the ``[D, D]`` float32 matrix must fit a program's shared memory):
   eight codes fill whole bytes, and a tile keeps whole vectors in registers (checked by the op
   function, which falls back to the reference under ``"auto"``).
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
from .naive import TINY, RotationOperand, inverse_sqrt_dim, rotation_dim

_TILE_ELEMENTS = 2048
"""Elements per program: ``BLOCK_ROWS = _TILE_ELEMENTS / D`` vectors."""
_MIN_DOT_ROWS = 16
"""``tl.dot`` needs at least 16 rows per program."""


_TINY = tl.constexpr(TINY)
"""Triton kernels read only ``constexpr`` globals."""


def _block_rows(dim: int, hadamard: bool) -> int:
    rows = max(1, _TILE_ELEMENTS // dim)
    return rows if hadamard else max(rows, _MIN_DOT_ROWS)


def _operand(rotation: RotationOperand, device: torch.device) -> tuple[torch.Tensor, bool]:
    """The tensor the kernel reads (signs ``[D]`` or the matrix ``[D, D]``) and ``HADAMARD``."""
    if rotation.matrix is not None:
        return rotation.matrix.to(device, torch.float32).contiguous(), False
    assert rotation.signs is not None
    return rotation.signs.to(device, torch.float32).contiguous(), True


@kernel
def _encode_kernel(
    x_ptr: tl.tensor,
    rotation_ptr: tl.tensor,
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
    HADAMARD: tl.constexpr,
) -> None:
    first = tl.program_id(0).to(tl.int64) * BLOCK_ROWS
    rows = first + tl.arange(0, BLOCK_ROWS).to(tl.int64)  # [R]
    cols = tl.arange(0, DIM)  # [D]
    row_ok = rows < n_rows
    x = upcast(tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :],
                       mask=row_ok[:, None], other=0.0), tl.float32)  # [R, D]
    norms = tl.sqrt_rn(tree_sum_rows(x * x, BLOCK_ROWS, DIM, LOG2_DIM))  # [R]
    unit = tl.div_rn(x, tl.maximum(norms, _TINY)[:, None])  # [R, D]
    if HADAMARD:
        signs = tl.load(rotation_ptr + cols)  # [D]
        rotated = butterfly_rows(unit * signs[None, :], BLOCK_ROWS, DIM, LOG2_DIM) * inv_sqrt_dim
    else:
        # transposed[k, n] = M[n, k], so (unit @ transposed)[r, n] = sum_k M[n, k] unit[r, k]
        transposed = tl.load(rotation_ptr + cols[None, :] * DIM + cols[:, None])  # [D, D]
        rotated = tl.dot(unit, transposed, input_precision="ieee")  # [R, D]
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
    rotation_ptr: tl.tensor,
    levels_ptr: tl.tensor,
    out_ptr: tl.tensor,
    n_rows: tl.int64,
    inv_sqrt_dim: float,
    DIM: tl.constexpr,
    LOG2_DIM: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    HADAMARD: tl.constexpr,
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
    if HADAMARD:
        signs = tl.load(rotation_ptr + cols)  # [D]
        unit = butterfly_rows(values, BLOCK_ROWS, DIM, LOG2_DIM) * inv_sqrt_dim * signs[None, :]
    else:
        matrix = tl.load(rotation_ptr + cols[:, None] * DIM + cols[None, :])  # [D, D]
        unit = tl.dot(values, matrix, input_precision="ieee")  # [R, D]: values @ M
    norms = tl.load(norms_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)  # [R]
    out = unit * norms[:, None]
    tl.store(out_ptr + rows[:, None] * DIM + cols[None, :], downcast(out, out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def encode(
    x: torch.Tensor,
    rotation: RotationOperand,
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
        operand, hadamard = _operand(rotation, x.device)
        block_rows = _block_rows(dim, hadamard)
        _encode_kernel[(cdiv(n_rows, block_rows),)](
            x, operand, thresholds.to(x.device), packed, norms, n_rows, x.stride(0),
            inverse_sqrt_dim(dim), DIM=dim, LOG2_DIM=dim.bit_length() - 1, BITS=bits,
            BLOCK_ROWS=block_rows, HADAMARD=hadamard, enable_fp_fusion=ENABLE_FP_FUSION,
        )
    return packed, norms


def decode(
    packed: torch.Tensor,
    norms: torch.Tensor,
    rotation: RotationOperand,
    levels: torch.Tensor,
    bits: int,
    dtype: torch.dtype,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Kernel twin of ``naive.decode``; ``out`` (``[N, D]``, contiguous) may be pre-allocated."""
    n_rows, dim = norms.shape[0], rotation_dim(rotation)
    if out is None:
        out = torch.empty(n_rows, dim, dtype=dtype, device=packed.device)
    if n_rows:
        operand, hadamard = _operand(rotation, packed.device)
        block_rows = _block_rows(dim, hadamard)
        _decode_kernel[(cdiv(n_rows, block_rows),)](
            packed, norms, operand, levels.to(packed.device), out, n_rows,
            inverse_sqrt_dim(dim), DIM=dim, LOG2_DIM=dim.bit_length() - 1, BITS=bits,
            BLOCK_ROWS=block_rows, HADAMARD=hadamard, enable_fp_fusion=ENABLE_FP_FUSION,
        )
    return out

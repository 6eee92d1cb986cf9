"""Torch halves of the shared building blocks; each mirrors a device function in ``triton.py``.

Motivation: a kernel's integer outputs equal its reference's only when both round the same
floating-point operations in the same order. Library reductions (``torch.sum``, ``tl.sum``,
``torch.linalg.vector_norm``) fix no order, so every floating-point sum whose result feeds a code
is written here as an explicit pairwise tree that the kernel reproduces step for step. The fp16
rounding of side information (norms, scales, zero-points) lives here too, because both the
references and the quantizers above them store it.

Invariants:
1. :func:`tree_sum` adds adjacent pairs, ``x[2i] + x[2i+1]``, level after level, over the last
   dim zero-padded to a power of two; each addition is one IEEE operation, so the result does
   not depend on the backend (enforced by construction; checked against the device twin in
   ``tests/test_kernels_common.py``).
2. :func:`butterfly` is the unnormalised Walsh-Hadamard transform (checked: against the
   Sylvester matrix in ``tests/test_kernels_common.py``).
3. :func:`sqrt_rn` is the correctly rounded float32 square root (IEEE ``sqrt``), which
   ``tl.sqrt_rn`` computes (enforced: one exact correction step; checked against numpy's
   ``sqrt``).
4. :func:`round_up_fp16` / :func:`round_down_fp16` return the nearest float16 on the stated side
   of a float32 value; values beyond the float16 range raise ``ValueError`` (enforced; the
   device twins return ``inf`` and the op raises the same error after the launch).
5. Nothing here reads or writes state outside its arguments (enforced).
"""

from __future__ import annotations

import math

import torch

from seqkv.errors import InvalidTensorError

FP16_MAX = float(torch.finfo(torch.float16).max)
"""Largest finite float16 (65504): side information beyond it cannot be stored."""


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim by adjacent pairs: ``[..., W] -> [...]``.

    A width that is not a power of two is padded with zeros first (adding ``+0.0`` is exact).

    >>> tree_sum(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    tensor(10.)
    >>> tree_sum(torch.tensor([[1.0, 2.0, 3.0]]))
    tensor([6.])
    """
    width = x.shape[-1]
    padded = 1 << max(width - 1, 0).bit_length()
    if padded != width:
        x = torch.cat([x, x.new_zeros((*x.shape[:-1], padded - width))], dim=-1)  # [..., W2]
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]  # [..., W / 2]
    return x[..., 0]


def butterfly(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh-Hadamard transform along the last dim (a power of two), ``H x``.

    Stage ``h = 1, 2, 4, ...`` maps each pair ``(a, b)`` at distance ``h`` to ``(a + b, a - b)``.

    >>> butterfly(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    tensor([1., 1., 1., 1.])
    """
    d = x.shape[-1]
    lead = x.shape[:-1]
    y = x.reshape(-1, d)  # [N, D]
    h = 1
    while h < d:
        pairs = y.reshape(-1, d // (2 * h), 2, h)  # [N, D / 2h, 2, h]
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, d)  # [N, D]
        h *= 2
    return y.reshape(*lead, d)  # [..., D]


def sqrt_rn(s: torch.Tensor) -> torch.Tensor:
    """Correctly rounded square root of non-negative float32 ``s`` (float32 result).

    NOTE: ``torch.sqrt`` on CPU is not correctly rounded (measured on this project's AVX-512
    machine: one ulp off for 17% of float32 inputs, 1.2% of float64 inputs). The float64 root
    rounded to float32 is at most one ulp off; it is corrected by comparing ``s`` with the squares
    of the two neighbouring midpoints, which float64 holds exactly (26-bit midpoints).

    >>> float(sqrt_rn(torch.tensor([3.594799409256666e-06]))[0])
    0.0018959955777972937
    """
    wide = s.to(torch.float64)
    root = torch.sqrt(wide).to(torch.float32)
    up = torch.nextafter(root, torch.full_like(root, math.inf))
    down = torch.nextafter(root, torch.zeros_like(root))
    mid_up = (root.double() + up.double()) * 0.5
    mid_down = (root.double() + down.double()) * 0.5
    root = torch.where(mid_up * mid_up < wide, up, root)
    return torch.where(mid_down * mid_down > wide, down, root)


def vector_norms(rows: torch.Tensor) -> torch.Tensor:
    """Euclidean norms of float32 rows ``[N, D] -> [N]``: tree-summed squares, rounded root.

    >>> vector_norms(torch.tensor([[3.0, 4.0]]))
    tensor([5.])
    """
    return sqrt_rn(tree_sum(rows * rows))


def check_fp16_range(values: torch.Tensor, what: str) -> None:
    """Raise ``InvalidTensorError`` unless every value is finite and within float16's range."""
    if values.numel() and not float(values.abs().max()) <= FP16_MAX:
        raise InvalidTensorError(
            f"{what} exceeds the float16 range ({FP16_MAX}); rescale the input before quantizing"
        )


def to_fp16(values: torch.Tensor, what: str) -> torch.Tensor:
    """Round ``values`` to float16 (nearest), refusing values float16 cannot hold.

    >>> to_fp16(torch.tensor([1.0 / 3.0]), "x").item()
    0.333251953125
    """
    check_fp16_range(values, what)
    return values.to(torch.float16)


def round_up_fp16(values: torch.Tensor, what: str) -> torch.Tensor:
    """Round float32 ``values`` to the nearest float16 that is ``>=`` the value."""
    half = to_fp16(values, what)
    low = half.float() < values
    return torch.where(low, torch.nextafter(half, torch.full_like(half, math.inf)), half)


def round_down_fp16(values: torch.Tensor, what: str) -> torch.Tensor:
    """Round float32 ``values`` to the nearest float16 that is ``<=`` the value."""
    half = to_fp16(values, what)
    high = half.float() > values
    return torch.where(high, torch.nextafter(half, torch.full_like(half, -math.inf)), half)

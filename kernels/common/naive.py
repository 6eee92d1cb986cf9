"""Torch halves of the shared building blocks; each mirrors a device function in ``triton.py``.

Motivation: a kernel's integer outputs equal its reference's only when both round the same
floating-point operations in the same order. Library reductions (``torch.sum``, ``tl.sum``) fix
no order, so every floating-point sum whose result feeds a code or a table is written here as an
explicit pairwise tree that the kernel reproduces step for step.

Invariants:
1. :func:`tree_sum` adds adjacent pairs, ``x[2i] + x[2i+1]``, level after level; each addition
   is one IEEE operation, so the result does not depend on the backend (enforced by
   construction; checked against the device twin in ``tests/test_kernels_common.py``).
2. :func:`butterfly` is the unnormalised Walsh-Hadamard transform with the stage order and
   pairing of :func:`seqkv.quantizers.rotation.walsh_hadamard` (checked: equal to it times
   ``sqrt(d)`` up to that function's final division).
3. :func:`sqrt_rn` is the correctly rounded float32 square root (IEEE ``sqrt``), which
   ``tl.sqrt_rn`` computes (enforced: one exact correction step; checked against numpy's
   ``sqrt`` in ``tests/test_kernels_common.py``).
4. Inputs have a power-of-two last dimension (assumed; callers check).
"""

from __future__ import annotations

import math

import torch


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim (a power of two) by adjacent pairs: ``[..., W] -> [...]``.

    >>> tree_sum(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    tensor(10.)
    """
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

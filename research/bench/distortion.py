"""Measured distortion of TurboQuant on random unit vectors, in the JSON shape the CLI reports.

Motivation: the paper's distortion figures (ANCHORS.md) are derivations; this module measures
them for the implementation at hand, on vectors drawn uniformly from the unit sphere, so a
``python -m research.bench quant --json`` can print the measured table next to the paper's.

Invariants:
1. Deterministic for a given ``seed`` (enforced: vectors come from ``torch.Generator(seed)``,
   quantizers are seeded with ``seed``).
2. Keys of the outer dict are head dims and of the inner dict bit widths, both as decimal strings,
   because the result is the JSON shape (enforced).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seqkv.errors import InsufficientSamplesError
from seqkv.quantizers.rotation import RotationKind
from seqkv.quantizers.turboquant import TurboQuantMSE, TurboQuantProd

DistortionTable = dict[str, dict[str, float]]
"""``{head_dim: {bits: value}}``, both keys decimal strings (the JSON shape)."""


def random_unit_vectors(n: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """``[n, dim]`` float32 vectors uniform on the unit sphere."""
    g = torch.randn(n, dim, generator=generator)  # [n, D]
    unit: torch.Tensor = g / torch.linalg.vector_norm(g, dim=-1, keepdim=True)
    return unit


def turboquant_mse_table(
    dims: Sequence[int] = (64, 128),
    bits: Sequence[int] = (1, 2, 3, 4),
    n_vectors: int = 4000,
    seed: int = 0,
    rotation: RotationKind = "orthogonal",
) -> DistortionTable:
    """``E||x - xhat||^2`` of :class:`TurboQuantMSE` over ``n_vectors`` random unit vectors.

    >>> table = turboquant_mse_table(dims=(64,), bits=(2,), n_vectors=500)
    >>> 0.10 < table["64"]["2"] < 0.13
    True
    """
    if n_vectors < 1:
        raise InsufficientSamplesError(f"n_vectors must be positive, got {n_vectors}")
    table: DistortionTable = {}
    for dim in dims:
        x = random_unit_vectors(n_vectors, dim, torch.Generator().manual_seed(seed))
        row: dict[str, float] = {}
        for b in bits:
            quantizer = TurboQuantMSE(dim, b, rotation=rotation, seed=seed)
            err = x - quantizer.dequantize(quantizer.quantize(x))  # [n, D]
            row[str(b)] = float(err.square().sum(dim=-1).mean())
        table[str(dim)] = row
    return table


def turboquant_prod_ip_table(
    dims: Sequence[int] = (64, 128),
    bits: Sequence[int] = (1, 2, 3, 4),
    n_vectors: int = 4000,
    seed: int = 0,
    rotation: RotationKind = "orthogonal",
    n_seeds: int = 8,
) -> DistortionTable:
    """``d * E[(<y, x> - <y, xhat>)^2]`` of :class:`TurboQuantProd` for independent random unit
    ``x`` and ``y``: the inner-product distortion in units of ``1/d``, the unit of the paper's
    figures (1.57, 0.56, 0.18, 0.047 at b = 1..4).

    The paper's expectation is over the quantizer's randomness (``R`` and ``S``); one fixed ``S``
    shifts the figure by a few percent, so the vectors are split over ``n_seeds`` quantizers
    (seeds ``seed``, ``seed + 1``, ...).
    """
    if n_vectors < 1 or not 1 <= n_seeds <= n_vectors:
        raise InsufficientSamplesError(
            f"need n_vectors >= n_seeds >= 1, got n_vectors={n_vectors}, n_seeds={n_seeds}"
        )
    table: DistortionTable = {}
    for dim in dims:
        generator = torch.Generator().manual_seed(seed)
        x = random_unit_vectors(n_vectors, dim, generator).unsqueeze(-2)  # [n, 1, D]
        y = random_unit_vectors(n_vectors, dim, generator).unsqueeze(-2)  # [n, 1, D]
        exact = (x * y).sum(dim=-1).reshape(-1)  # [n]
        chunks = torch.arange(n_vectors).tensor_split(n_seeds)
        row: dict[str, float] = {}
        for b in bits:
            sq_err = torch.empty(n_vectors)
            for k, idx in enumerate(chunks):
                quantizer = TurboQuantProd(dim, b, rotation=rotation, seed=seed + k)
                est = quantizer.inner_product(y[idx], quantizer.quantize(x[idx])).reshape(-1)
                sq_err[idx] = (est - exact[idx]).square()
            row[str(b)] = dim * float(sq_err.mean())
        table[str(dim)] = row
    return table

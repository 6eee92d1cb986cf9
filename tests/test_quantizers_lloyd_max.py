"""Lloyd-Max codebooks: the known distortion values, and the closed forms against quadrature."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from seqkv.quantizers.lloyd_max import CoordinateLaw, coordinate_pdf, lloyd_max_codebook

# E||x - xhat||^2 for unit vectors (= d * per-coordinate MSE), b = 1..4.
KNOWN = {
    ("sphere", 64): (0.3584, 0.1145, 0.0334, 0.0091),
    ("sphere", 128): (0.3609, 0.1160, 0.0340, 0.0093),
    ("gaussian", 128): (0.3634, 0.1175, 0.0345, 0.0095),
}


@pytest.mark.parametrize(("law", "dim"), list(KNOWN))
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_known_distortion(law: CoordinateLaw, dim: int, bits: int) -> None:
    cb = lloyd_max_codebook(dim, bits, law)
    assert cb.vector_mse == pytest.approx(KNOWN[(law, dim)][bits - 1], rel=0.01)


def test_gaussian_limit_does_not_depend_on_dim() -> None:
    a, b = lloyd_max_codebook(64, 3, "gaussian"), lloyd_max_codebook(4096, 3, "gaussian")
    assert a.vector_mse == pytest.approx(b.vector_mse, rel=1e-9)
    # ... and the sphere law approaches it from below as d grows.
    assert lloyd_max_codebook(64, 3).vector_mse < lloyd_max_codebook(4096, 3).vector_mse
    assert lloyd_max_codebook(4096, 3).vector_mse == pytest.approx(a.vector_mse, rel=2e-3)


def test_one_bit_closed_form() -> None:
    # At 1 bit the levels are +-E|X| and the distortion is 1 - d E|X|^2.
    dim = 64
    mean_abs = 2.0 * integrate.quad(lambda t: t * coordinate_pdf(np.array(t), dim), 0, 1)[0]
    cb = lloyd_max_codebook(dim, 1)
    assert cb.levels[1] == pytest.approx(mean_abs, rel=1e-9)
    assert cb.vector_mse == pytest.approx(1.0 - dim * mean_abs**2, rel=1e-9)


@pytest.mark.parametrize(
    ("law", "dim", "bits"),
    [("sphere", 64, 3), ("sphere", 5, 2), ("gaussian", 128, 3), ("sphere", 128, 6)],
)
def test_levels_are_centroids_and_mse_matches_quadrature(
    law: CoordinateLaw, dim: int, bits: int
) -> None:
    cb = lloyd_max_codebook(dim, bits, law)
    lo, hi = (-1.0, 1.0) if law == "sphere" else (-math.inf, math.inf)
    edges = [lo, *cb.thresholds, hi]

    def pdf(t: float) -> float:
        return float(coordinate_pdf(np.array([t]), dim, law)[0])

    mse = 0.0
    for level, a, b in zip(cb.levels, edges[:-1], edges[1:], strict=True):
        mass = integrate.quad(pdf, a, b, epsabs=1e-14, epsrel=1e-12)[0]
        first = integrate.quad(lambda t: t * pdf(t), a, b, epsabs=1e-14, epsrel=1e-12)[0]
        assert first / mass == pytest.approx(level, rel=1e-7, abs=1e-10)
        mse += integrate.quad(lambda t, c=level: (t - c) ** 2 * pdf(t), a, b, epsabs=1e-15)[0]
    assert cb.coordinate_mse == pytest.approx(mse, rel=1e-6)


@pytest.mark.parametrize("bits", range(1, 9))
def test_codebook_shape_symmetry_and_order(bits: int) -> None:
    cb = lloyd_max_codebook(128, bits)
    levels = np.array(cb.levels)
    assert levels.size == 2**bits and len(cb.thresholds) == 2**bits - 1
    assert np.all(np.diff(levels) > 0)
    np.testing.assert_allclose(levels, -levels[::-1], atol=1e-15)
    np.testing.assert_allclose(cb.thresholds, (levels[1:] + levels[:-1]) / 2)
    # Panter-Dite: distortion ~ c 4^-b; each extra bit divides it by roughly 4 (3.1 .. 4).
    if bits > 1:
        ratio = lloyd_max_codebook(128, bits - 1).vector_mse / cb.vector_mse
        assert 3.0 < ratio < 4.01


def test_cached_codebook_is_shared_and_immutable() -> None:
    a = lloyd_max_codebook(96, 3)
    assert lloyd_max_codebook(96, 3) is a
    with pytest.raises(AttributeError):
        a.bits = 4  # type: ignore[misc]

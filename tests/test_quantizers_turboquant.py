"""TurboQuant: distortion against the Lloyd-Max optimum, rotations, unbiased inner products.

Measured on this implementation (4000 random unit vectors, seed 0), E||x - xhat||^2:
  orthogonal d=64: 0.3587 0.1146 0.0334 0.0091   d=128: 0.3608 0.1158 0.0338 0.0093
  hadamard   d=64: 0.3561 0.1138 0.0332 0.0091   d=128: 0.3601 0.1157 0.0338 0.0093
TurboQuantProd, d * E[(<y,x> - est)^2] for independent unit x, y (8 seeds x 500 pairs):
  orthogonal d=64: 1.53 0.558 0.178 0.051   d=128: 1.55 0.567 0.176 0.053
  hadamard   d=64: 1.59 0.552 0.180 0.051   d=128: 1.53 0.584 0.186 0.054
  paper:           1.57 0.56  0.18  0.047
  derived (pi/2 - 1/d) D_mse(b-1), d=64: 1.555 0.557 0.178 0.052; d=128: 1.563 0.564 0.181 0.053.
The paper's 0.047 is pi/2 x its rounded D_mse(3) = 0.03; with the exact 0.0334-0.0340 the figure
is ~0.053, 13% above the paper's, which the band below allows and reports.
"""

from __future__ import annotations

import math

import pytest
import torch

from research.bench.distortion import (
    random_unit_vectors,
    turboquant_mse_table,
    turboquant_prod_ip_table,
)
from seqkv.kernels.turboquant.naive import walsh_hadamard
from seqkv.quantizers import TurboQuantMSE, TurboQuantProd, lloyd_max_codebook
from seqkv.quantizers.rotation import Rotation, RotationKind

OPTIMUM = {
    64: (0.3584, 0.1145, 0.0334, 0.0091),
    128: (0.3609, 0.1160, 0.0340, 0.0093),
}
PAPER_IP = (1.57, 0.56, 0.18, 0.047)  # inner-product distortion x d, b = 1..4


@pytest.mark.parametrize("rotation", ["orthogonal", "hadamard"])
def test_mse_within_five_percent_of_lloyd_max_optimum(rotation: RotationKind) -> None:
    table = turboquant_mse_table(n_vectors=4000, seed=0, rotation=rotation)
    for dim, row in OPTIMUM.items():
        for bits, optimum in enumerate(row, start=1):
            measured = table[str(dim)][str(bits)]
            assert measured == pytest.approx(optimum, rel=0.05), (dim, bits, measured)


def test_mse_upper_and_lower_bounds_of_the_paper() -> None:
    table = turboquant_mse_table(dims=(128,), bits=(1, 2, 3, 4, 5), n_vectors=2000)
    for bits, measured in table["128"].items():
        b = int(bits)
        assert 4.0**-b < measured < math.sqrt(3) * math.pi / 2 * 4.0**-b


@pytest.mark.parametrize("rotation", ["orthogonal", "hadamard"])
def test_rotation_is_orthogonal(rotation: RotationKind) -> None:
    rot = Rotation.draw(64, rotation, torch.Generator().manual_seed(3))
    x = torch.randn(10, 64, generator=torch.Generator().manual_seed(4))
    y = rot.forward(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rot.inverse(y), x, atol=1e-5, rtol=1e-5)


def test_walsh_hadamard_matches_sylvester_matrix() -> None:
    h = torch.ones(1, 1)
    while h.shape[0] < 32:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)  # Sylvester
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(walsh_hadamard(x), x @ h.T / math.sqrt(32))
    torch.testing.assert_close(walsh_hadamard(walsh_hadamard(x)), x, atol=1e-5, rtol=1e-5)


def test_hadamard_is_not_haar_for_an_axis_input() -> None:
    # The documented deviation: an axis vector maps to coordinates of equal magnitude.
    rot = Rotation.draw(64, "hadamard", torch.Generator().manual_seed(0))
    y = rot.forward(torch.eye(64)[:1])
    torch.testing.assert_close(y.abs(), torch.full_like(y, 1 / 8))


def test_norm_scaling_dtype_and_zero_vectors() -> None:
    q = TurboQuantMSE(64, 4, seed=1)
    x = torch.randn(2, 3, 50, 64, generator=torch.Generator().manual_seed(0)) * 7.0
    x[0, 0, 0] = 0.0
    x16 = x.half()
    out = q.dequantize(q.quantize(x16))
    assert out.dtype == torch.float16 and out.shape == x.shape
    assert torch.all(out[0, 0, 0] == 0)
    rel = ((out.float() - x16.float()).square().sum(-1) / x16.float().square().sum(-1))[0, 1]
    assert float(rel.mean()) == pytest.approx(lloyd_max_codebook(64, 4).vector_mse, rel=0.15)


def test_deterministic_given_seed_and_different_across_seeds() -> None:
    x = random_unit_vectors(100, 64, torch.Generator().manual_seed(0))
    a = TurboQuantMSE(64, 2, seed=5).quantize(x)
    b = TurboQuantMSE(64, 2, seed=5).quantize(x)
    c = TurboQuantMSE(64, 2, seed=6).quantize(x)
    assert a.codes is not None and b.codes is not None and c.codes is not None
    assert torch.equal(a.codes.data, b.codes.data)
    assert not torch.equal(a.codes.data, c.codes.data)


def test_prod_first_stage_is_the_mse_quantizer_with_one_bit_less() -> None:
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(1))
    prod = TurboQuantProd(128, 3, rotation="hadamard", seed=9).quantize(x)
    mse = TurboQuantMSE(128, 2, rotation="hadamard", seed=9).quantize(x)
    assert prod.codes is not None and mse.codes is not None
    assert torch.equal(prod.codes.data, mse.codes.data)


def test_prod_dequantize_agrees_with_inner_product() -> None:
    q = TurboQuantProd(64, 2, seed=0)
    gen = torch.Generator().manual_seed(2)
    keys, queries = torch.randn(2, 30, 64, generator=gen), torch.randn(2, 5, 64, generator=gen)
    qk = q.quantize(keys)
    torch.testing.assert_close(
        q.inner_product(queries, qk),
        queries @ q.dequantize(qk).transpose(-1, -2),
        atol=1e-4,
        rtol=1e-4,
    )


@pytest.mark.parametrize("rotation", ["orthogonal", "hadamard"])
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_prod_inner_product_is_unbiased_over_seeds(bits: int, rotation: RotationKind) -> None:
    """Fixed pairs with <x, y> = 0.6, averaged over 64 independent draws of (R, S).

    The MSE stage alone is biased (its reconstruction shrinks: E<x, xhat> = 1 - D_mse); the
    same statistic for it must be far from zero, or this test could not fail. Measured: prod
    |z| <= 2.6 in all eight cases; the MSE stage z ~ -390, -150, -52 at 1, 2, 3 bits.
    """
    dim, n_pairs, n_seeds = 64, 128, 64
    gen = torch.Generator().manual_seed(11)
    x = random_unit_vectors(n_pairs, dim, gen)  # [P, D]
    z = random_unit_vectors(n_pairs, dim, gen)
    z = z - (z * x).sum(-1, keepdim=True) * x
    z = z / z.norm(dim=-1, keepdim=True)
    y = 0.6 * x + 0.8 * z  # [P, D], <x, y> = 0.6
    exact = (x * y).sum(-1)  # [P]
    prod_means, mse_means = [], []
    for seed in range(n_seeds):
        q = TurboQuantProd(dim, bits, rotation=rotation, seed=seed)
        est = q.inner_product(y.unsqueeze(1), q.quantize(x.unsqueeze(1))).reshape(-1)  # [P]
        prod_means.append(float((est - exact).mean()))
        if bits > 1:
            m = TurboQuantMSE(dim, bits - 1, rotation=rotation, seed=seed)
            mse_est = (m.dequantize(m.quantize(x)) * y).sum(-1)
            mse_means.append(float((mse_est - exact).mean()))
    per_seed = torch.tensor(prod_means)
    z_prod = float(per_seed.mean() / (per_seed.std() / math.sqrt(n_seeds)))
    assert abs(z_prod) < 4.0, z_prod
    if bits > 1:
        per_seed_mse = torch.tensor(mse_means)
        z_mse = float(per_seed_mse.mean() / (per_seed_mse.std() / math.sqrt(n_seeds)))
        assert z_mse < -8.0, z_mse


def test_prod_inner_product_distortion_near_paper_figures() -> None:
    table = turboquant_prod_ip_table(n_vectors=4000, seed=0, n_seeds=8)
    for dim in (64, 128):
        for bits in (1, 2, 3, 4):
            measured = table[str(dim)][str(bits)]
            d_mse = lloyd_max_codebook(dim, bits - 1).vector_mse if bits > 1 else 1.0
            derived = (math.pi / 2 - 1 / dim) * d_mse
            assert measured == pytest.approx(derived, rel=0.12), (dim, bits, measured)
            assert 0.8 < measured / PAPER_IP[bits - 1] < 1.3, (dim, bits, measured)


def test_mse_quantizer_has_much_lower_mse_than_prod_but_prod_is_unbiased() -> None:
    # The trade-off the paper states: at equal bits, prod pays MSE for unbiasedness.
    x = random_unit_vectors(1000, 64, torch.Generator().manual_seed(3))
    mse_q, prod_q = TurboQuantMSE(64, 3), TurboQuantProd(64, 3)
    mse_err = float((mse_q.dequantize(mse_q.quantize(x)) - x).square().sum(-1).mean())
    prod_err = float((prod_q.dequantize(prod_q.quantize(x)) - x).square().sum(-1).mean())
    assert mse_err < prod_err

"""Fixed-point functions against float64 references, with the error bounds the module states."""

from __future__ import annotations

import hashlib
import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv.models.integer import fixedpoint as fp
from seqkv.models.integer.table import LOG2E_FIXED


@pytest.fixture(scope="module")
def tables() -> fp.FixedPointTables:
    return fp.FixedPointTables.on(torch.device("cpu"))


def _int64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@given(st.lists(st.integers(0, (1 << 63) - 1), min_size=1, max_size=50))
def test_bit_length_is_exact(tables: fp.FixedPointTables, values: list[int]) -> None:
    expected = [v.bit_length() for v in values]
    assert fp.bit_length(_int64(values), tables).tolist() == expected
    assert fp.bit_length_np(np.array(values, dtype=np.int64)).tolist() == expected


@given(st.lists(st.integers(0, (1 << 63) - 1), min_size=1, max_size=50), st.integers(0, 40))
def test_excess_bits_is_the_smallest_fitting_shift(tables: fp.FixedPointTables,
                                                   values: list[int], bits: int) -> None:
    shifts = fp.excess_bits(_int64(values), bits, tables).tolist()
    for value, shift in zip(values, shifts, strict=True):
        assert value >> shift < 1 << bits
        assert shift == 0 or value >> (shift - 1) >= 1 << bits


@given(st.lists(st.integers(fp.RSQRT_MIN, fp.RSQRT_MAX), min_size=1, max_size=50),
       st.sampled_from([30, 38, 42]))
def test_rsqrt_within_its_stated_error(tables: fp.FixedPointTables, values: list[int],
                                       out_bits: int) -> None:
    result = fp.rsqrt(_int64(values), out_bits, tables).tolist()
    for value, got in zip(values, result, strict=True):
        exact = 2.0**out_bits / math.sqrt(value)
        assert abs(got - exact) <= (2.0**-17 + 2.0**-30) * exact + 1


@given(st.lists(st.integers(fp.RSQRT_MIN, fp.RSQRT_MAX), min_size=1, max_size=50))
def test_rsqrt_parts_keep_the_mantissa_in_range(tables: fp.FixedPointTables,
                                                values: list[int]) -> None:
    mantissa, half = fp.rsqrt_parts(_int64(values), tables)
    assert mantissa.dtype == torch.int32
    assert bool(((mantissa > 1 << 29) & (mantissa <= 1 << 30)).all())
    for value, m, h in zip(values, mantissa.tolist(), half.tolist(), strict=True):
        exact = 2.0**fp.RSQRT_MANTISSA_BITS / math.sqrt(value)
        assert abs(m * 2.0**-h - exact) <= (2.0**-17 + 2.0**-30) * exact


def test_rsqrt_raises_small_arguments_to_its_domain(tables: fp.FixedPointTables) -> None:
    below, at_min = fp.rsqrt(_int64([1, fp.RSQRT_MIN]), 38, tables).tolist()
    assert below == at_min


def test_sigmoid_within_its_stated_error(tables: fp.FixedPointTables) -> None:
    frac = 16
    x = torch.arange(-20 << frac, 20 << frac, 97, dtype=torch.int64)
    got = fp.sigmoid(x, frac, tables).to(torch.float64) / 2**30
    exact = torch.sigmoid(x.to(torch.float64) / 2**frac)
    assert (got - exact).abs().max().item() <= 2.0**-16 + 2.0**-31
    inside = x.abs() < (16 << frac)
    assert ((got - exact).abs() <= exact * 2.0**-14 + 2.0**-31)[inside].all()


def test_sigmoid_table_is_symmetric_to_rounding(tables: fp.FixedPointTables) -> None:
    table = fp.sigmoid_table()
    half = len(table) // 2
    assert table[half] == 1 << 29  # sigmoid(0) = 1/2
    # sigmoid(-y) + sigmoid(y) = 1, each rounded once
    assert all(abs(table[half - k] + table[half + k] - (1 << 30)) <= 1 for k in range(1, half))


def test_softmax_weights_are_rounded_powers_of_two(tables: fp.FixedPointTables) -> None:
    d = torch.arange(0, 17 << fp.EXP2_FRAC_BITS, dtype=torch.int64)
    got = fp.softmax_weights(d, tables).to(torch.float64)
    exact = 2.0 ** (fp.SOFTMAX_BITS - d.to(torch.float64) / (1 << fp.EXP2_FRAC_BITS))
    assert got[0].item() == (1 << fp.SOFTMAX_BITS) - 1
    assert ((got - exact).abs()[1:] <= 0.5 + exact[1:] * 2.0**-30).all()
    assert got[-1].item() == 0 and fp.softmax_weights(_int64([1 << 40]), tables).item() == 0


@given(st.lists(st.integers(0, 60 << fp.FINE_FRAC_BITS), min_size=1, max_size=50),
       st.sampled_from([20, 30, 45]))
def test_fine_exp2_within_its_stated_error(values: list[int], out_bits: int) -> None:
    got = fp.exp2_neg_fine(np.array(values, dtype=np.int64), out_bits)
    for value, result in zip(values, got.tolist(), strict=True):
        exact = 2.0 ** (out_bits - value / (1 << fp.FINE_FRAC_BITS))
        assert exact * (1 - 2.0**-29) - 1 <= result <= exact * (1 + 2.0**-29)


@given(st.lists(st.integers(1, (1 << 62) - 1), min_size=1, max_size=50))
def test_fine_log2_within_its_stated_error(values: list[int]) -> None:
    got = fp.log2_fine(np.array(values, dtype=np.int64))
    for value, result in zip(values, got.tolist(), strict=True):
        assert abs(result - math.log2(value)) < 2e-7


@pytest.mark.parametrize(("head_dim", "theta", "positions"),
                         [(64, 100000.0, 8192), (16, 10000.0, 300)])
def test_rope_tables_within_two_units_of_2_pow_minus_30(head_dim: int, theta: float,
                                                        positions: int) -> None:
    cos, sin = fp.rope_tables(head_dim, theta, positions)
    assert cos.shape == sin.shape == (positions, head_dim // 2)
    angle = np.arange(positions)[:, None] * theta ** (-np.arange(head_dim // 2) * 2 / head_dim)
    assert np.abs(cos - np.cos(angle) * 2**30).max() <= 2
    assert np.abs(sin - np.sin(angle) * 2**30).max() <= 2


def test_log2e_constant_is_correctly_rounded() -> None:
    with mpmath.workprec(120):
        assert mpmath.nint(mpmath.ldexp(1 / mpmath.log(2), 36)) == LOG2E_FIXED


def test_tables_are_golden() -> None:
    """The tables are part of every integer predictor: a change here changes every probability,
    so it must come with a PREDICTOR_VERSION bump and a new digest here."""
    digest = hashlib.sha256()
    for table in (fp.exp2_table(fp.EXP2_FRAC_BITS), fp.rsqrt_table(), fp.sigmoid_table(),
                  fp.log2_table(), fp.exp2_neg_table(fp.SOFTMAX_BITS, (1 << 14) - 1)):
        digest.update(np.array(table, dtype="<i8").tobytes())
    for part in fp.rope_tables(64, 100000.0, 1024):
        digest.update(part.astype("<i8").tobytes())
    assert digest.hexdigest() == GOLDEN_TABLES


GOLDEN_TABLES = "87c67800d11599b8f0835ccb999194c7ddb6f5c5c767f5619fc76b3e6b8710d6"

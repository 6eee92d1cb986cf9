"""The comparison helper shared by the kernel tests and the GPU check, and the doctests of
``seqkv.kernels``."""

from __future__ import annotations

import doctest
import importlib
import math

import pytest
import torch

from seqkv.kernels.testing import assert_matches, compare, filled, sentinels


def test_counts_mismatches_and_reports_positions() -> None:
    result = compare(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.5, 3.0, 5.0]),
                     atol=0.1, name="x")
    assert result.mismatches == 2
    assert [p for p, _, _ in result.first] == [(1,), (3,)]
    assert result.max_abs_diff == pytest.approx(1.0)
    assert "2 of 4 elements differ" in result.message()


def test_nan_and_inf_disagreements_are_reported_whatever_the_tolerance() -> None:
    actual = torch.tensor([math.nan, 1.0, math.inf, -math.inf, math.nan])
    expected = torch.tensor([1.0, math.nan, math.inf, math.inf, math.nan])
    result = compare(actual, expected, atol=1e9, rtol=1e9)
    assert result.nan_disagreements == 2
    assert result.inf_disagreements == 1
    assert result.mismatches == 3


def test_relative_tolerance_scales_with_the_expected_value() -> None:
    assert compare(torch.tensor([101.0]), torch.tensor([100.0]), rtol=0.02).ok
    assert not compare(torch.tensor([101.0]), torch.tensor([100.0]), rtol=0.005).ok


def test_integers_compare_exactly() -> None:
    with pytest.raises(ValueError, match="compare exactly"):
        compare(torch.tensor([1, 2]), torch.tensor([1, 2]), atol=1)
    with pytest.raises(AssertionError, match="1 of 2 elements differ"):
        assert_matches(torch.tensor([1, 2]), torch.tensor([1, 3]))


def test_shape_and_dtype_must_agree() -> None:
    with pytest.raises(AssertionError, match="shape"):
        assert_matches(torch.zeros(2), torch.zeros(3))
    with pytest.raises(AssertionError, match="dtype"):
        assert_matches(torch.zeros(2), torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.bool]
)
def test_sentinels_catch_an_unwritten_element(dtype: torch.dtype) -> None:
    """Whatever the true value, some sentinel run leaves an unwritten element different."""
    values = [False, True] if dtype == torch.bool else [0, 1, 255 if dtype == torch.uint8 else -7]
    for truth in values:
        caught = False
        for fill in sentinels(dtype):
            out = filled((2,), dtype, "cpu", fill)
            out[0] = truth  # the "kernel" writes element 0 only
            want = torch.full((2,), truth, dtype=dtype)
            caught |= not compare(out, want).ok
        assert caught, (dtype, truth)


MODULES = (
    "seqkv.kernels.dispatch",
    "seqkv.kernels.testing",
    "seqkv.kernels.common.naive",
    "seqkv.kernels.common.bitpack",
    "seqkv.kernels.turboquant",
    "seqkv.kernels.turboquant.naive",
    "seqkv.kernels.kivi",
    "seqkv.kernels.kivi.naive",
    "seqkv.kernels.absmax",
    "seqkv.kernels.absmax.naive",
    "seqkv.kernels.topk_expectation",
)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

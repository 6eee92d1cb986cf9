"""Residual kernels against their reference (symbols and rebuilt values exactly), and the
reference against ``seqkv.coding.residual.encode_residual``.

The kernels perform the reference's IEEE operations in the same order without FMA contraction,
so even the float32 outputs are compared exactly (tolerance 0).
"""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seqkv.coding.residual import ALPHABET_LIMIT, encode_residual  # noqa: E402
from seqkv.kernels import KernelBackend, residual_dequantize, residual_quantize  # noqa: E402
from seqkv.kernels.residual import ESCAPE, naive  # noqa: E402
from seqkv.kernels.residual import triton as kernels  # noqa: E402
from seqkv.kernels.testing import (  # noqa: E402
    assert_matches,
    filled,
    kernel_device,
    sentinels,
)

DEVICE = kernel_device()

shapes = st.lists(st.integers(1, 9), min_size=1, max_size=4)
tolerances = st.sampled_from([1e-6, 3e-5, 1e-4, 1.7e-3, 0.25, 10.0])


def _pair(
    shape: list[int], noise: float, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    prediction = torch.randn(shape, generator=generator) * 4
    target = prediction + torch.randn(shape, generator=generator) * noise
    flat = target.view(-1)
    if flat.numel() >= 3:
        flat[:3] = torch.tensor([1e30, -0.0, 1e-40])  # an escape, a signed zero, a subnormal
    return target.to(dtype).to(DEVICE), prediction.to(dtype).to(DEVICE)


@settings(max_examples=15, deadline=None)
@given(
    shape=shapes,
    tolerance=tolerances,
    noise=st.sampled_from([0.0, 1e-5, 1e-2, 1e3]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_quantize_matches_reference_exactly(
    shape: list[int], tolerance: float, noise: float, dtype: torch.dtype, seed: int
) -> None:
    target, prediction = _pair(shape, noise, dtype, seed)
    want_symbols, want_rebuilt = naive.quantize(target, prediction, tolerance)
    symbols = filled(tuple(shape), torch.int32, DEVICE, sentinels(torch.int32)[0])
    rebuilt = filled(tuple(shape), torch.float32, DEVICE, float("nan"))
    kernels.quantize(target, prediction, tolerance, symbols=symbols, rebuilt=rebuilt)
    assert_matches(symbols, want_symbols, name="symbols")
    assert_matches(rebuilt, want_rebuilt, name="rebuilt")


@settings(max_examples=15, deadline=None)
@given(
    shape=shapes,
    tolerance=tolerances,
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_dequantize_matches_reference_exactly(
    shape: list[int], tolerance: float, dtype: torch.dtype, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    prediction = (torch.randn(shape, generator=generator) * 4).to(dtype).to(DEVICE)
    symbols = torch.randint(-ALPHABET_LIMIT, ALPHABET_LIMIT + 1, shape, generator=generator,
                            dtype=torch.int32).to(DEVICE)  # ALPHABET_LIMIT itself is ESCAPE
    want = naive.dequantize(prediction, symbols, tolerance)
    out = filled(tuple(shape), torch.float32, DEVICE, float("nan"))
    kernels.dequantize(prediction, symbols, tolerance, out=out)
    assert_matches(out, want, name="rebuilt")


@pytest.mark.parametrize("tolerance", [1e-5, 1e-4, 1e-2, 1.0])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_agrees_with_the_residual_coder(tolerance: float, backend: KernelBackend) -> None:
    shape = (3, 2, 2, 5, 8)  # [L, 2, H, T, D]
    target, prediction = _pair(list(shape), 1e-3, torch.float32, seed=11)
    ours = residual_quantize(target, prediction, tolerance, backend=backend)
    code, rebuilt = encode_residual(target.cpu(), prediction.cpu(), tolerance)
    assert_matches(ours.rebuilt.cpu(), rebuilt, name="rebuilt vs encode_residual")
    assert ours.num_escapes == code.num_escapes
    assert float((ours.rebuilt - target).abs().max()) <= tolerance
    back = residual_dequantize(prediction, ours.symbols, tolerance, backend=backend)
    inliers = ours.symbols != ESCAPE
    assert_matches(back[inliers], ours.rebuilt[inliers], name="dequantized inliers")
    assert_matches(back[~inliers], prediction[~inliers], name="escaped elements")


def test_zero_tolerance_is_refused() -> None:
    with pytest.raises(ValueError, match="bit-exact mode"):
        residual_quantize(torch.zeros(3), torch.zeros(3), 0.0, backend="torch")


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match="same shape"):
        residual_quantize(torch.zeros(3), torch.zeros(4), 1e-4, backend="torch")


def test_non_finite_target_is_refused() -> None:
    with pytest.raises(ValueError, match="NaN or infinite"):
        residual_quantize(torch.tensor([float("inf")]), torch.zeros(1), 1e-4, backend="torch")


def test_symbols_must_be_int32() -> None:
    with pytest.raises(ValueError, match="int32"):
        residual_dequantize(torch.zeros(3), torch.zeros(3, dtype=torch.int64), 1e-4,
                            backend="torch")

"""Top-k expectation: the reference is the top-k predictor's arithmetic bit for bit; the kernel
agrees with the reference within stated float tolerances.

The kernel sums the probabilities and the ``k`` weighted candidates in its own order, so results
differ from the reference by float32 rounding of a ``k``-term sum (a few ulps of the largest
term), plus the rounding of the output dtype.
"""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seqkv.errors import InvalidTensorError  # noqa: E402
from seqkv.kernels import KernelBackend, topk_expectation  # noqa: E402
from seqkv.kernels.testing import assert_matches, filled, kernel_device  # noqa: E402
from seqkv.kernels.topk_expectation import naive  # noqa: E402
from seqkv.kernels.topk_expectation import triton as kernels  # noqa: E402

DEVICE = kernel_device()

# (candidate dtype, atol, rtol). Candidates are O(1) and weights sum to 1: float32 allows a few
# ulps of a k-term sum; fp16 (ulp 2**-10 relative) and bf16 (2**-7) allow one output ulp, since a
# float32 difference can move the rounding of the output.
DTYPES = [
    (torch.float32, 1e-6, 1e-5),
    (torch.float16, 1e-3, 1e-3),
    (torch.bfloat16, 8e-3, 8e-3),
]


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(0, 20),
    k=st.integers(1, 12),
    dim=st.integers(1, 70),
    case=st.sampled_from(DTYPES),
    probs_dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_matches_reference(
    n: int,
    k: int,
    dim: int,
    case: tuple[torch.dtype, float, float],
    probs_dtype: torch.dtype,
    seed: int,
) -> None:
    dtype, atol, rtol = case
    generator = torch.Generator().manual_seed(seed)
    probs = torch.rand(n, k, generator=generator)
    if n and k > 1:
        probs[0, 1:] = 0.0  # a row with all weight on one candidate
    probs = probs.to(probs_dtype).to(DEVICE)
    candidates = torch.randn(n, k, dim, generator=generator).to(dtype).to(DEVICE)
    want = naive.expectation(probs, candidates)
    out = filled((n, dim), dtype, DEVICE, float("nan"))
    kernels.expectation(probs, candidates, out=out)
    assert_matches(out, want, atol=atol, rtol=rtol, name=f"expectation {dtype}")


@settings(max_examples=10, deadline=None)
@given(
    k=st.integers(1, 24),
    layers=st.integers(1, 3),
    heads=st.integers(1, 3),
    dim=st.integers(1, 70),
    seed=st.integers(0, 2**16),
)
def test_reference_is_the_top_k_predictor_arithmetic(
    k: int, layers: int, heads: int, dim: int, seed: int
) -> None:
    """The arithmetic ``seqkv.delta.predictors.topk_expectation`` had inline before it called
    this op, for one shared probability vector over ``[layers, 2, heads, k, head_dim]``
    candidates: the op called as the predictor calls it returns the same bits."""
    generator = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(100, generator=generator, dtype=torch.float64), dim=-1)
    top = torch.topk(probs, k)
    written = torch.randn(layers, 2, heads, k + 1, dim, generator=generator)  # + the true token
    weights = (top.values / top.values.sum()).to(torch.float32)  # [k]
    expected = written[:, :, :, :k, :] * weights.view(1, 1, 1, -1, 1)
    inline = expected.sum(dim=3)  # [L, 2, H, D]
    op = topk_expectation(top.values, written[:, :, :, :k, :], backend="torch")
    assert_matches(op, inline, name="op vs the predictor's inline arithmetic")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_shared_probabilities_broadcast(backend: KernelBackend) -> None:
    probs = torch.tensor([3.0, 1.0], dtype=torch.float64).to(DEVICE)  # [k]
    candidates = torch.tensor([[[1.0, 0.0], [0.0, 4.0]], [[2.0, 2.0], [6.0, 6.0]]]).to(DEVICE)
    out = topk_expectation(probs, candidates, backend=backend)  # [2, D]
    assert_matches(out.cpu(), torch.tensor([[0.75, 1.0], [3.0, 3.0]]), atol=1e-6,
                   name="weighted mean")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_leading_dims_and_renormalisation(backend: KernelBackend) -> None:
    probs = torch.tensor([[[0.2, 0.2], [0.0, 0.5]]]).to(DEVICE)  # [1, 2, k=2]
    candidates = torch.tensor([[[[1.0, 3.0], [3.0, 1.0]], [[9.0, 9.0], [2.0, 4.0]]]]).to(DEVICE)
    out = topk_expectation(probs, candidates, backend=backend)
    want = torch.tensor([[[2.0, 2.0], [2.0, 4.0]]])
    assert_matches(out.cpu(), want, atol=1e-6, name="weighted mean")


def test_negative_probability_is_refused() -> None:
    with pytest.raises(InvalidTensorError, match="non-negative"):
        topk_expectation(torch.tensor([[0.5, -0.1]]), torch.zeros(1, 2, 3), backend="torch")


def test_zero_row_is_refused() -> None:
    with pytest.raises(InvalidTensorError, match="positive sum"):
        topk_expectation(torch.zeros(1, 2), torch.zeros(1, 2, 3), backend="torch")


def test_mismatched_k_is_refused() -> None:
    with pytest.raises(InvalidTensorError, match="the same k"):
        topk_expectation(torch.ones(2, 3), torch.zeros(2, 4, 5), backend="torch")


def test_probs_that_do_not_broadcast_are_refused() -> None:
    with pytest.raises(InvalidTensorError, match="do not broadcast"):
        topk_expectation(torch.ones(3, 4), torch.zeros(2, 4, 5), backend="torch")


def test_too_many_candidates_for_the_kernel_when_forced() -> None:
    probs, candidates = torch.ones(1, 300).to(DEVICE), torch.zeros(1, 300, 2).to(DEVICE)
    with pytest.raises(ValueError, match="exceeds 256"):
        topk_expectation(probs, candidates, backend="triton")

"""Frequency-table kernel against its reference (tables exactly equal), the tables' invariants,
and the reference against ``seqkv.coding.frequencies`` (numpy).

Exact equality with numpy's float64 softmax is not promised (see
``seqkv.kernels.frequencies``); the last test bounds the difference instead.
"""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seqkv.coding.frequencies import TOTAL_FREQUENCY, cumulative_from_logits  # noqa: E402
from seqkv.kernels import KernelBackend, frequency_tables  # noqa: E402
from seqkv.kernels.frequencies import naive  # noqa: E402
from seqkv.kernels.frequencies import triton as kernels  # noqa: E402
from seqkv.kernels.testing import (  # noqa: E402
    assert_matches,
    filled,
    kernel_device,
    sentinels,
)

DEVICE = kernel_device()


def _logits(n: int, vocab: int, scale: float, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, vocab, generator=generator) * scale
    if vocab >= 4 and n:
        x[:, 1] = x[:, 3] = x.max() + 1.0  # a tie for the most probable symbol
        x[:, 2] = -torch.inf  # a masked symbol
    return x.to(dtype).to(DEVICE)


def _check_table(table: torch.Tensor) -> None:
    counts = table.diff(dim=-1)
    assert bool((table[:, 0] == 0).all())
    assert bool((table[:, -1] == TOTAL_FREQUENCY).all())
    assert bool((counts >= 1).all())


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(0, 3),
    vocab=st.integers(1, 300),
    block=st.sampled_from([16, 64, 1024]),
    scale=st.sampled_from([0.01, 3.0, 30.0, 3000.0]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_tables_match_reference_exactly(
    n: int, vocab: int, block: int, scale: float, dtype: torch.dtype, seed: int
) -> None:
    logits = _logits(n, vocab, scale, dtype, seed)
    want = naive.cumulative_tables(logits, block)
    out = filled((n, vocab + 1), torch.int64, DEVICE, sentinels(torch.int64)[0])
    kernels.cumulative_tables(logits, block, out=out)
    assert_matches(out, want, name="cumulative tables")
    _check_table(want)


def test_deterministic_exp_is_close_to_exp() -> None:
    z = -torch.logspace(-12, np.log10(700.0), 20_000, dtype=torch.float64)
    z = torch.cat([z, torch.zeros(1, dtype=torch.float64)])
    ours, exact = naive.deterministic_exp(z), torch.exp(z)
    assert float(((ours - exact) / exact).abs().max()) < 4e-16  # within two ulps
    tiny = naive.deterministic_exp(torch.tensor([-800.0, -torch.inf], dtype=torch.float64))
    assert tiny.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_masked_symbols_get_one_count_and_ties_go_to_the_first(backend: KernelBackend) -> None:
    logits = torch.tensor([[0.0, 5.0, -torch.inf, 5.0]]).to(DEVICE)
    counts = frequency_tables(logits, backend=backend).diff(dim=-1)[0].tolist()
    assert counts[2] == 1
    assert counts[1] > counts[3]  # the remainder went to the first maximum
    assert counts[1] - counts[3] < 64


def test_reference_is_within_one_count_of_numpy() -> None:
    """Against ``cumulative_from_logits``, every symbol's count but the most frequent one's is
    within 1 (the last-bit differences of exp and of the sum cross a floor now and then); the
    most frequent symbol absorbs the difference."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 5000, generator=generator) * torch.tensor([[0.1], [1], [3], [10],
                                                                        [30], [100]])
    ours = naive.cumulative_tables(logits).diff(dim=-1).numpy()
    theirs = np.stack([np.diff(cumulative_from_logits(row.numpy())) for row in logits])
    top = ours.argmax(axis=-1)
    assert (top == theirs.argmax(axis=-1)).all()
    others = np.ones_like(ours, dtype=bool)
    others[np.arange(len(top)), top] = False
    assert np.abs(ours - theirs)[others].max() <= 1


def test_nan_logits_are_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        frequency_tables(torch.tensor([[0.0, float("nan")]]), backend="torch")


def test_positive_infinity_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\+inf"):
        frequency_tables(torch.tensor([[0.0, float("inf")]]), backend="torch")


def test_a_row_without_a_finite_logit_is_refused() -> None:
    with pytest.raises(ValueError, match="finite value"):
        frequency_tables(torch.full((1, 3), -torch.inf), backend="torch")


def test_one_dimensional_logits_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        frequency_tables(torch.zeros(5), backend="torch")


def test_empty_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        frequency_tables(torch.zeros(2, 0), backend="torch")


def test_block_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        frequency_tables(torch.zeros(1, 5), block=24, backend="torch")


def test_integer_logits_are_refused() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        frequency_tables(torch.zeros(1, 5, dtype=torch.int32), backend="torch")


def test_kernel_refuses_a_block_beyond_a_tile_when_forced() -> None:
    with pytest.raises(ValueError, match="block=8192 > 4096"):
        frequency_tables(torch.zeros(1, 5).to(DEVICE), block=8192, backend="triton")

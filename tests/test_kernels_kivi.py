"""KIVI kernels against their reference: codes, packed bytes, scales and zero-points exactly;
decoded values within the tolerances below (all zero).

Without a GPU the kernels run on Triton's CPU interpreter (TRITON_INTERPRET=1, exported by
``scripts/test.sh``); ``scripts/gpu_check.sh`` runs this file on CUDA tensors.
"""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()


import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seqkv.errors import InvalidTensorError, QuantizerConfigError  # noqa: E402
from seqkv.kernels import (  # noqa: E402
    GroupAxis,
    KernelBackend,
    UnsupportedKernelInputError,
    kivi_dequantize,
    kivi_quantize,
)
from seqkv.kernels.kivi import naive  # noqa: E402
from seqkv.kernels.kivi import triton as kernels  # noqa: E402
from seqkv.kernels.testing import (  # noqa: E402
    assert_matches,
    filled,
    kernel_device,
    sentinels,
)

DEVICE = kernel_device()

# (input dtype, atol, rtol) for decoded values: the kernel computes codes * scale + zero exactly
# as the reference (no FMA) and rounds to the output dtype to nearest even (bf16 by hand, see
# kernels/common/triton.py), so decoded values agree to the bit: every tolerance is 0.
DTYPES = [
    (torch.float32, 0.0, 0.0),
    (torch.float16, 0.0, 0.0),
    (torch.bfloat16, 0.0, 0.0),
]

axes = st.sampled_from(["tokens", "channels"])


def _cache(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * 3.0
    if x.numel() >= 4:
        flat = x.view(-1)
        flat[:4] = torch.tensor([0.0, -0.0, 1.0, 1.0])  # signed zeros and a repeated value
    if x.shape[-2] >= 1:
        x[..., 0, :] = 2.5  # a constant row: constant key groups get scale 0
    return x.to(dtype).to(DEVICE)


@settings(max_examples=15, deadline=None)
@given(
    n_lead=st.integers(1, 3),
    n_tokens=st.integers(0, 40),
    dim=st.integers(1, 20),
    axis=axes,
    group_size=st.integers(1, 9),
    bits=st.integers(1, 8),
    case=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_quantize_head_matches_reference_exactly(
    n_lead: int,
    n_tokens: int,
    dim: int,
    axis: GroupAxis,
    group_size: int,
    bits: int,
    case: tuple[torch.dtype, float, float],
    seed: int,
) -> None:
    head = _cache((n_lead, n_tokens, dim), case[0], seed)
    want_packed, want_scales, want_zeros = naive.quantize_head(head, axis, group_size, bits)
    for fill in sentinels(torch.uint8):
        packed = filled(tuple(want_packed.shape), torch.uint8, DEVICE, fill)
        scales = filled(tuple(want_scales.shape), torch.float16, DEVICE, float("nan"))
        zeros = filled(tuple(want_zeros.shape), torch.float16, DEVICE, float("nan"))
        kernels.quantize_head(head, axis, group_size, bits, packed=packed, scales=scales,
                              zeros=zeros)
        assert_matches(packed, want_packed, name=f"packed codes (sentinel {fill})")
        assert_matches(scales, want_scales, name="scales")
        assert_matches(zeros, want_zeros, name="zero-points")


@settings(max_examples=15, deadline=None)
@given(
    n_lead=st.integers(1, 3),
    n_tokens=st.integers(0, 40),
    dim=st.integers(1, 20),
    axis=axes,
    group_size=st.integers(1, 9),
    bits=st.integers(1, 8),
    case=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_dequantize_head_matches_reference(
    n_lead: int,
    n_tokens: int,
    dim: int,
    axis: GroupAxis,
    group_size: int,
    bits: int,
    case: tuple[torch.dtype, float, float],
    seed: int,
) -> None:
    dtype, atol, rtol = case
    shape = (n_lead, n_tokens, dim)
    packed, scales, zeros = naive.quantize_head(_cache(shape, dtype, seed), axis, group_size, bits)
    want = naive.dequantize_head(packed, scales, zeros, shape, axis, group_size, bits, dtype)
    out = filled(shape, dtype, DEVICE, float("nan"))
    kernels.dequantize_head(packed, scales, zeros, shape, axis, group_size, bits, dtype, out=out)
    assert_matches(out, want, atol=atol, rtol=rtol, name=f"decoded {dtype}")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_zero_point_beyond_fp16_raises(backend: KernelBackend) -> None:
    x = torch.full((1, 3, 4), -7e4).to(DEVICE)
    with pytest.raises(InvalidTensorError, match="zero-point exceeds the float16 range"):
        kivi_quantize(x, "channels", 4, 2, backend=backend)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_scale_beyond_fp16_raises(backend: KernelBackend) -> None:
    x = torch.tensor([[[-6e4, 6e4, 0.0, 1.0]]]).to(DEVICE)  # range 1.2e5 at one level
    with pytest.raises(InvalidTensorError, match="scale exceeds the float16 range"):
        kivi_quantize(x, "channels", 4, 1, backend=backend)


def test_head_must_be_three_dimensional() -> None:
    with pytest.raises(InvalidTensorError, match=r"head \[L, T, D\]"):
        kivi_quantize(torch.randn(5, 4), "tokens", 2, 2, backend="torch")


def test_unknown_axis_is_refused() -> None:
    with pytest.raises(QuantizerConfigError, match="axis must be"):
        kivi_quantize(torch.randn(1, 5, 4), "heads", 2, 2)  # type: ignore[arg-type]


def test_foreign_side_shape_raises_on_dequantize() -> None:
    packed, scales, zeros = kivi_quantize(torch.randn(1, 40, 8), "tokens", 4, 2)
    with pytest.raises(InvalidTensorError, match=r"must have shape \(1, 5, 8\)"):
        kivi_dequantize(packed, scales, zeros, (1, 40, 8), "tokens", 8, 2, torch.float32)


def test_every_code_within_half_a_step_of_the_input() -> None:
    """KIVI's half-step bound holds for the kernel's output too."""
    x = torch.randn(6, 41, 16, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    packed, scales, zeros = kivi_quantize(x, "tokens", 8, 2, backend="triton")
    step = scales.to(torch.float32).repeat_interleave(8, dim=-2)[..., :41, :]
    out = kivi_dequantize(packed, scales, zeros, (6, 41, 16), "tokens", 8, 2, torch.float32,
                          backend="triton")
    err = (out - x).abs()
    assert bool((err <= step / 2 * (1 + 1e-6) + 1e-7).all()), float(err.max())


def test_kernel_refuses_groups_beyond_a_tile_when_forced() -> None:
    x = torch.randn(1, 20, 4).to(DEVICE)
    with pytest.raises(UnsupportedKernelInputError, match="group_size=5000 exceeds 4096"):
        kivi_quantize(x, "channels", 5000, 2, backend="triton")

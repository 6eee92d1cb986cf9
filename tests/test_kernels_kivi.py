"""KIVI kernels against their reference, and the reference against
:class:`seqkv.quantizers.KIVI`: codes, packed bytes, scales and zero-points exactly; decoded
values within the tolerances below.

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

from seqkv.kernels import KernelBackend, kivi_dequantize, kivi_quantize  # noqa: E402
from seqkv.kernels.kivi import naive  # noqa: E402
from seqkv.kernels.kivi import triton as kernels  # noqa: E402
from seqkv.kernels.testing import (  # noqa: E402
    assert_matches,
    filled,
    kernel_device,
    sentinels,
)
from seqkv.quantizers import KIVI, KiviRole, KiviWindow  # noqa: E402

DEVICE = kernel_device()

# (input dtype, atol, rtol) for decoded values: the kernel computes codes * scale + zero exactly
# as the reference (no FMA) and rounds to the output dtype to nearest even (bf16 by hand, see
# kernels/common/triton.py), so decoded values agree to the bit: every tolerance is 0.
DTYPES = [
    (torch.float32, 0.0, 0.0),
    (torch.float16, 0.0, 0.0),
    (torch.bfloat16, 0.0, 0.0),
]

roles = st.sampled_from(["key", "value"])


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
    role=roles,
    group_size=st.integers(1, 9),
    bits=st.integers(1, 8),
    case=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_quantize_head_matches_reference_exactly(
    n_lead: int,
    n_tokens: int,
    dim: int,
    role: KiviRole,
    group_size: int,
    bits: int,
    case: tuple[torch.dtype, float, float],
    seed: int,
) -> None:
    head = _cache((n_lead, n_tokens, dim), case[0], seed)
    want_packed, want_scales, want_zeros = naive.quantize_head(head, role, group_size, bits)
    for fill in sentinels(torch.uint8):
        packed = filled(tuple(want_packed.shape), torch.uint8, DEVICE, fill)
        scales = filled(tuple(want_scales.shape), torch.float16, DEVICE, float("nan"))
        zeros = filled(tuple(want_zeros.shape), torch.float16, DEVICE, float("nan"))
        kernels.quantize_head(head, role, group_size, bits, packed=packed, scales=scales,
                              zeros=zeros)
        assert_matches(packed, want_packed, name=f"packed codes (sentinel {fill})")
        assert_matches(scales, want_scales, name="scales")
        assert_matches(zeros, want_zeros, name="zero-points")


@settings(max_examples=15, deadline=None)
@given(
    n_lead=st.integers(1, 3),
    n_tokens=st.integers(0, 40),
    dim=st.integers(1, 20),
    role=roles,
    group_size=st.integers(1, 9),
    bits=st.integers(1, 8),
    case=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_dequantize_head_matches_reference(
    n_lead: int,
    n_tokens: int,
    dim: int,
    role: KiviRole,
    group_size: int,
    bits: int,
    case: tuple[torch.dtype, float, float],
    seed: int,
) -> None:
    dtype, atol, rtol = case
    shape = (n_lead, n_tokens, dim)
    packed, scales, zeros = naive.quantize_head(_cache(shape, dtype, seed), role, group_size, bits)
    want = naive.dequantize_head(packed, scales, zeros, shape, role, group_size, bits, dtype)
    out = filled(shape, dtype, DEVICE, float("nan"))
    kernels.dequantize_head(packed, scales, zeros, shape, role, group_size, bits, dtype, out=out)
    assert_matches(out, want, atol=atol, rtol=rtol, name=f"decoded {dtype}")


@settings(max_examples=10, deadline=None)
@given(
    lead=st.lists(st.integers(1, 2), min_size=0, max_size=2),
    n_tokens=st.integers(0, 30),
    dim=st.integers(1, 12),
    role=roles,
    group_size=st.integers(1, 6),
    residual_length=st.integers(0, 7),
    window=st.sampled_from(["recent", "streaming"]),
    bits=st.integers(1, 4),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    backend=st.sampled_from(["torch", "triton"]),
    seed=st.integers(0, 2**16),
)
def test_op_equals_the_quantizer_on_cpu(
    lead: list[int],
    n_tokens: int,
    dim: int,
    role: KiviRole,
    group_size: int,
    residual_length: int,
    window: KiviWindow,
    bits: int,
    dtype: torch.dtype,
    backend: KernelBackend,
    seed: int,
) -> None:
    if window == "streaming":
        residual_length = group_size * max(1, residual_length // group_size)
    quantizer = KIVI(dim, bits, role=role, group_size=group_size,
                     residual_length=residual_length, window=window)
    x = _cache((*lead, n_tokens, dim), dtype, seed)
    ours = kivi_quantize(x, quantizer, backend=backend)
    theirs = quantizer.quantize(x.cpu())
    assert ours.codes is not None and theirs.codes is not None
    assert ours.codes.shape == theirs.codes.shape
    assert_matches(ours.codes.data.cpu(), theirs.codes.data, name="packed codes")
    for name in ("scales", "zero_points", "dense"):
        mine, want = getattr(ours, name), getattr(theirs, name)
        assert_matches(mine.cpu(), want, name=name)
    assert ours.num_bits == theirs.num_bits == quantizer.num_bits_for(tuple(x.shape))
    decoded = kivi_dequantize(ours, quantizer, backend=backend)
    assert_matches(decoded.cpu(), quantizer.dequantize(theirs), name="decoded vs quantizer")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_zero_point_beyond_fp16_raises(backend: KernelBackend) -> None:
    quantizer = KIVI(4, 2, role="value", group_size=4, residual_length=0)
    x = torch.full((3, 4), -7e4).to(DEVICE)
    with pytest.raises(ValueError, match="zero-point exceeds the float16 range"):
        kivi_quantize(x, quantizer, backend=backend)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_scale_beyond_fp16_raises(backend: KernelBackend) -> None:
    quantizer = KIVI(4, 1, role="value", group_size=4, residual_length=0)
    x = torch.tensor([[-6e4, 6e4, 0.0, 1.0]]).to(DEVICE)  # range 1.2e5 at one level
    with pytest.raises(ValueError, match="scale exceeds the float16 range"):
        kivi_quantize(x, quantizer, backend=backend)


def test_wrong_dim_raises() -> None:
    with pytest.raises(ValueError, match="dim=8"):
        kivi_quantize(torch.randn(2, 5, 4), KIVI(8, 2), backend="torch")


def test_foreign_configuration_raises_on_dequantize() -> None:
    x = torch.randn(1, 40, 8)
    q = kivi_quantize(x, KIVI(8, 2, group_size=4, residual_length=8), backend="torch")
    with pytest.raises(ValueError, match="another KIVI"):
        kivi_dequantize(q, KIVI(8, 2, group_size=8, residual_length=8), backend="torch")


def test_every_code_within_half_a_step_of_the_input() -> None:
    """KIVI's invariant 1 holds for the kernel's output too."""
    quantizer = KIVI(16, 2, role="key", group_size=8, residual_length=4)
    x = torch.randn(2, 3, 45, 16, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    q = kivi_quantize(x, quantizer, backend="triton")
    assert q.scales is not None
    n_quant = 45 - 4
    step = q.scales.to(torch.float32).repeat_interleave(8, dim=-2)[..., :n_quant, :]
    err = (kivi_dequantize(q, quantizer, backend="triton") - x)[..., :n_quant, :].abs()
    assert bool((err <= step / 2 * (1 + 1e-6) + 1e-7).all()), float(err.max())


def test_kernel_refuses_groups_beyond_a_tile_when_forced() -> None:
    x = torch.randn(1, 20, 4).to(DEVICE)
    quantizer = KIVI(4, 2, role="value", group_size=5000, residual_length=0)
    with pytest.raises(ValueError, match="group_size=5000 exceeds 4096"):
        kivi_quantize(x, quantizer, backend="triton")

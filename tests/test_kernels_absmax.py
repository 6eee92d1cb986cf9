"""Absmax int8 / fp8 kernels against their reference: codes, scales and decoded values exact,
over odd shapes, every input dtype and the rounding edges of e4m3 (ties, subnormals, signed
zeros, the largest value).

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
    AbsmaxFormat,
    KernelBackend,
    UnsupportedKernelInputError,
    absmax_dequantize,
    absmax_quantize,
)
from seqkv.kernels.absmax import naive  # noqa: E402
from seqkv.kernels.absmax import triton as kernels  # noqa: E402
from seqkv.kernels.testing import assert_matches, filled, kernel_device, sentinels  # noqa: E402

DEVICE = kernel_device()
FORMATS: list[AbsmaxFormat] = ["int8", "fp8_e4m3"]
# Decoded values are code * scale in float32 on both sides, rounded to the output dtype to
# nearest even (bf16 by hand in the kernel): every tolerance is 0.
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _rows(n: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scale = 10.0 ** (torch.rand(n, 1, generator=generator) * 8 - 5)  # 1e-5 .. 1e3 per row
    x = torch.randn(n, dim, generator=generator) * scale  # [N, D]
    if n >= 3:
        x[0] = 0.0  # a zero vector: scale 0
        x[1, 0] = -0.0
        x[2] = -x[2].abs()  # all negative
    return x.to(dtype).to(DEVICE)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(0, 37),
    dim=st.integers(1, 70),
    fmt=st.sampled_from(FORMATS),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_quantize_matches_reference_exactly(
    n: int, dim: int, fmt: AbsmaxFormat, dtype: torch.dtype, seed: int
) -> None:
    x = _rows(n, dim, dtype, seed)
    want_codes, want_scales = naive.quantize(x, fmt)
    for fill in sentinels(torch.uint8):
        codes = filled((n * dim,), torch.uint8, DEVICE, fill)
        scales = filled((n,), torch.float16, DEVICE, float("nan"))
        kernels.quantize(x, fmt, codes=codes, scales=scales)
        assert_matches(codes, want_codes, name=f"{fmt} codes (sentinel {fill})")
        assert_matches(scales, want_scales, name="scales")


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(0, 37),
    dim=st.integers(1, 70),
    fmt=st.sampled_from(FORMATS),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_dequantize_matches_reference_exactly(
    n: int, dim: int, fmt: AbsmaxFormat, dtype: torch.dtype, seed: int
) -> None:
    codes, scales = naive.quantize(_rows(n, dim, dtype, seed), fmt)
    want = naive.dequantize(codes, scales, dim, fmt, dtype)
    out = filled((n, dim), dtype, DEVICE, float("nan"))
    kernels.dequantize(codes, scales, dim, fmt, dtype, out=out)
    assert_matches(out, want, name=f"{fmt} decoded {dtype}")


def _e4m3_edges() -> torch.Tensor:
    """Scaled values at e4m3's rounding edges: every code, the midpoints between neighbours
    (ties), just either side of them, subnormals, signed zeros and the largest value."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = values.float()[torch.isfinite(values.float())].unique()  # sorted, -448 .. 448
    mids = (finite[1:] + finite[:-1]) / 2
    nudged = torch.cat([torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)])
    tiny = torch.tensor([-0.0, 0.0, 1e-40, -1e-40, 2.0**-10, -(2.0**-10), 2.0**-6, 448.0])
    return torch.cat([finite, mids, nudged, tiny])


def test_fp8_kernel_rounds_every_edge_like_torch() -> None:
    edges = _e4m3_edges()
    pad = (-edges.numel()) % 64
    rows = torch.cat([edges, torch.zeros(pad)]).reshape(-1, 64)  # [N, 64]
    rows[:, -1] = 448.0  # every row's absmax is 448: the scale is exactly 1
    rows = rows.to(DEVICE)
    want_codes, want_scales = naive.quantize(rows, "fp8_e4m3")
    assert bool((want_scales == 1.0).all())
    codes, _ = kernels.quantize(rows, "fp8_e4m3")
    assert_matches(codes, want_codes, name="fp8 codes at the edges")


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_decodes_every_byte_like_torch(fmt: AbsmaxFormat) -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEVICE)  # one row of 256
    scales = torch.ones(1, dtype=torch.float16, device=DEVICE)
    want = naive.dequantize(codes, scales, 256, fmt, torch.float32)
    assert_matches(kernels.dequantize(codes, scales, 256, fmt, torch.float32), want,
                   name=f"{fmt} values of every byte")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_scale_beyond_fp16_raises(backend: KernelBackend) -> None:
    x = torch.full((2, 4), 1e7).to(DEVICE)  # 1e7 / 127 > 65504
    with pytest.raises(InvalidTensorError, match="absmax scale exceeds the float16 range"):
        absmax_quantize(x, "int8", backend=backend)


def test_rows_must_be_two_dimensional() -> None:
    with pytest.raises(InvalidTensorError, match=r"rows \[N, D\]"):
        absmax_quantize(torch.randn(2, 3, 4), "int8")


def test_unknown_format_is_refused() -> None:
    with pytest.raises(QuantizerConfigError, match="fmt must be one of"):
        absmax_quantize(torch.randn(2, 4), "int4")  # type: ignore[arg-type]


def test_codes_of_the_wrong_size_are_refused() -> None:
    with pytest.raises(InvalidTensorError, match=r"uint8 codes of shape \(8,\)"):
        absmax_dequantize(torch.zeros(7, dtype=torch.uint8), torch.ones(2), 4, "int8",
                          torch.float32)


def test_kernel_refuses_long_vectors_when_forced() -> None:
    with pytest.raises(UnsupportedKernelInputError, match="exceed 4096"):
        absmax_quantize(torch.randn(1, 5000).to(DEVICE), "fp8_e4m3", backend="triton")

"""TurboQuant kernels against their reference, for both rotations: Hadamard codes, bytes and
decoded values exact; orthogonal norms exact, codes exact except within float32 rounding of a
threshold (the dot product's summation order), decoded values within a stated tolerance.

Without a GPU the kernels run on Triton's CPU interpreter, which needs TRITON_INTERPRET=1 in the
environment before Python starts (``scripts/test.sh`` exports it;
``use_interpreter_without_gpu`` below says so if it is missing). ``scripts/gpu_check.sh`` runs
this file on CUDA tensors.
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
    KernelBackend,
    UnsupportedKernelInputError,
    turboquant_dequantize,
    turboquant_quantize,
)
from seqkv.kernels.common.bitpack import unpack_bits  # noqa: E402
from seqkv.kernels.testing import (  # noqa: E402
    assert_matches,
    filled,
    kernel_device,
    sentinels,
)
from seqkv.kernels.turboquant import naive  # noqa: E402
from seqkv.kernels.turboquant import triton as kernels  # noqa: E402
from seqkv.quantizers import TurboQuantMSE  # noqa: E402
from seqkv.quantizers.rotation import RotationKind  # noqa: E402

DEVICE = kernel_device()

# (input dtype, atol, rtol) for decoded values with the Hadamard rotation. The kernel performs
# the reference's operations in the same order without FMA contraction, and both round the
# float32 result to the output dtype to nearest even (bf16 by hand in the kernel, see
# kernels/common/triton.py), so decoded values agree to the bit: every tolerance is 0.
DTYPES = [
    (torch.float32, 0.0, 0.0),
    (torch.float16, 0.0, 0.0),
    (torch.bfloat16, 0.0, 0.0),
]
# Orthogonal rotation: decoded rows are norm * (levels @ M), a D-term float32 dot product in two
# summation orders (and with FMA on a GPU). Inputs are scaled to norms ~3 * sqrt(D) <= 34 and
# levels are <= 1 in magnitude: float32 rounding of a 128-term sum of values up to 34 stays well
# below 1e-4 (measured on the interpreter: < 1e-5), plus one output ulp for fp16 / bf16. A wrong
# element (a bad code, a wrong row) is off by O(1).
ORTHOGONAL_ATOL = {torch.float32: 1e-4, torch.float16: 4e-2, torch.bfloat16: 3e-1}
# A rotated coordinate whose code may differ between the two summation orders lies within float32
# rounding of a threshold: coordinates and thresholds are below 1 in magnitude, and a 128-term
# float32 dot product is accurate to well within 1e-5 of that.
NEAR_THRESHOLD = 1e-5


def _quantizer(dim: int, bits: int, seed: int, rotation: RotationKind) -> TurboQuantMSE:
    return TurboQuantMSE(dim, bits, rotation=rotation, seed=seed)


def _rows(n: int, dim: int, dtype: torch.dtype, scale: float, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=generator) * scale  # [N, D]
    if n >= 2:
        x[0] = 0.0  # a zero vector
        x[1] = 0.0
        x[1, seed % dim] = scale  # an axis vector: every rotated coordinate is +-1/sqrt(d)
    return x.to(dtype).to(DEVICE)


def _tables(q: TurboQuantMSE) -> tuple[torch.Tensor, torch.Tensor]:
    return q.codebook.thresholds_tensor(DEVICE), q.codebook.levels_tensor(DEVICE)


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(0, 37),
    log2_dim=st.integers(3, 7),
    bits=st.integers(1, 8),
    case=st.sampled_from(DTYPES),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
    seed=st.integers(0, 3),
)
def test_hadamard_encode_matches_reference_exactly(
    n: int,
    log2_dim: int,
    bits: int,
    case: tuple[torch.dtype, float, float],
    scale: float,
    seed: int,
) -> None:
    dim = 1 << log2_dim
    q = _quantizer(dim, bits, seed, "hadamard")
    thresholds, _ = _tables(q)
    x = _rows(n, dim, case[0], scale, seed)
    want_packed, want_norms = naive.encode(x, q.rotation, thresholds, bits)
    for fill in sentinels(torch.uint8):
        packed = filled(tuple(want_packed.shape), torch.uint8, DEVICE, fill)
        norms = filled((n,), torch.float32, DEVICE, float("nan"))
        kernels.encode(x, q.rotation, thresholds, bits, packed=packed, norms=norms)
        assert_matches(packed, want_packed, name=f"packed codes (sentinel {fill})")
        assert_matches(norms, want_norms, name="norms")


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(0, 37),
    log2_dim=st.integers(3, 7),
    bits=st.integers(1, 8),
    case=st.sampled_from(DTYPES),
    seed=st.integers(0, 3),
)
def test_hadamard_decode_matches_reference(
    n: int, log2_dim: int, bits: int, case: tuple[torch.dtype, float, float], seed: int
) -> None:
    dtype, atol, rtol = case
    dim = 1 << log2_dim
    q = _quantizer(dim, bits, seed, "hadamard")
    thresholds, levels = _tables(q)
    packed, norms32 = naive.encode(_rows(n, dim, dtype, 3.0, seed), q.rotation, thresholds, bits)
    norms = norms32.to(torch.float16)
    want = naive.decode(packed, norms, q.rotation, levels, bits, dtype)
    out = filled((n, dim), dtype, DEVICE, float("nan"))
    kernels.decode(packed, norms, q.rotation, levels, bits, dtype, out=out)
    assert_matches(out, want, atol=atol, rtol=rtol, name=f"decoded {dtype}")


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(0, 37),
    log2_dim=st.integers(4, 7),
    bits=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 3),
)
def test_orthogonal_encode_matches_reference_up_to_threshold_ties(
    n: int, log2_dim: int, bits: int, dtype: torch.dtype, seed: int
) -> None:
    dim = 1 << log2_dim
    q = _quantizer(dim, bits, seed, "orthogonal")
    thresholds, _ = _tables(q)
    x = _rows(n, dim, dtype, 3.0, seed)
    want_packed, want_norms = naive.encode(x, q.rotation, thresholds, bits)
    packed = filled(tuple(want_packed.shape), torch.uint8, DEVICE, 0)
    norms = filled((n,), torch.float32, DEVICE, float("nan"))
    kernels.encode(x, q.rotation, thresholds, bits, packed=packed, norms=norms)
    assert_matches(norms, want_norms, name="norms")
    got = unpack_bits(packed.cpu(), bits, n * dim).reshape(n, dim)
    want = unpack_bits(want_packed.cpu(), bits, n * dim).reshape(n, dim)
    differ = got != want
    unit = naive.unit_rows(x.cpu().float(), want_norms.cpu())
    rotated = naive.rotate(unit, q.rotation)  # [N, D]
    distance = (rotated.unsqueeze(-1) - thresholds.cpu()).abs().amin(dim=-1)
    assert bool((distance[differ] < NEAR_THRESHOLD).all()), distance[differ]
    assert int(differ.sum()) <= max(2, n * dim // 1000), int(differ.sum())


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(0, 37),
    log2_dim=st.integers(4, 7),
    bits=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 3),
)
def test_orthogonal_decode_matches_reference(
    n: int, log2_dim: int, bits: int, dtype: torch.dtype, seed: int
) -> None:
    dim = 1 << log2_dim
    q = _quantizer(dim, bits, seed, "orthogonal")
    thresholds, levels = _tables(q)
    packed, norms32 = naive.encode(_rows(n, dim, dtype, 3.0, seed), q.rotation, thresholds, bits)
    norms = norms32.to(torch.float16)
    want = naive.decode(packed, norms, q.rotation, levels, bits, dtype)
    out = filled((n, dim), dtype, DEVICE, float("nan"))
    kernels.decode(packed, norms, q.rotation, levels, bits, dtype, out=out)
    assert_matches(out, want, atol=ORTHOGONAL_ATOL[dtype], name=f"decoded {dtype}")


@pytest.mark.parametrize("rotation", ["hadamard", "orthogonal"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_round_trip_distortion(backend: KernelBackend, rotation: RotationKind) -> None:
    q = _quantizer(64, 3, 5, rotation)
    thresholds, levels = _tables(q)
    x = torch.randn(200, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    packed, norms = turboquant_quantize(x, q.rotation, thresholds, 3, backend=backend)
    out = turboquant_dequantize(packed, norms.half(), q.rotation, levels, 3, torch.float32,
                                backend=backend)
    mse = float((out - x).square().sum() / x.square().sum())
    assert 0.025 < mse < 0.045  # 3-bit TurboQuant at d = 64: 0.0334 (lloyd_max reference)


def test_reference_norms_are_correctly_rounded() -> None:
    """The reference norm is the correctly rounded root of the tree-summed squares: equal to the
    float64 norm rounded to float32 for vectors whose squares sum exactly (small integers)."""
    x = torch.randint(-20, 21, (500, 16), generator=torch.Generator().manual_seed(2)).float()
    q = _quantizer(16, 2, 0, "hadamard")
    _, norms = naive.encode(x, q.rotation, q.codebook.thresholds_tensor(), 2)
    assert_matches(norms, x.double().norm(dim=-1).float(), name="norms")


def test_mismatched_rotation_dim_is_refused() -> None:
    q = _quantizer(16, 2, 0, "hadamard")
    with pytest.raises(InvalidTensorError, match=r"rows \[N, 16\]"):
        turboquant_quantize(torch.randn(3, 8), q.rotation, q.codebook.thresholds_tensor(), 2)


def test_wrong_threshold_count_is_refused() -> None:
    q = _quantizer(16, 2, 0, "hadamard")
    with pytest.raises(
        QuantizerConfigError, match=r"thresholds for 3-bit codes must have shape \(7,\)"
    ):
        turboquant_quantize(torch.randn(3, 16), q.rotation, q.codebook.thresholds_tensor(), 3)


def test_wrong_packed_size_is_refused() -> None:
    q = _quantizer(16, 2, 0, "hadamard")
    with pytest.raises(InvalidTensorError, match="need 8 packed bytes"):
        turboquant_dequantize(torch.zeros(7, dtype=torch.uint8), torch.ones(2), q.rotation,
                              q.codebook.levels_tensor(), 2, torch.float32)


def test_kernel_refuses_a_dim_below_eight_when_forced() -> None:
    q = _quantizer(4, 2, 0, "hadamard")
    x = torch.randn(3, 4).to(DEVICE)
    with pytest.raises(UnsupportedKernelInputError, match=r"power of two in 8\.\.1024"):
        turboquant_quantize(x, q.rotation, q.codebook.thresholds_tensor(DEVICE), 2,
                            backend="triton")


def test_kernel_refuses_a_wide_orthogonal_matrix_when_forced() -> None:
    q = _quantizer(256, 2, 0, "orthogonal")
    x = torch.randn(3, 256).to(DEVICE)
    with pytest.raises(UnsupportedKernelInputError, match=r"power of two in 16\.\.128"):
        turboquant_quantize(x, q.rotation, q.codebook.thresholds_tensor(DEVICE), 2,
                            backend="triton")


@pytest.mark.parametrize(("dim", "rotation"), [(4, "hadamard"), (96, "orthogonal")])
def test_auto_runs_the_reference_where_the_kernel_cannot(dim: int,
                                                         rotation: RotationKind) -> None:
    q = _quantizer(dim, 2, 0, rotation)
    x = torch.randn(5, dim, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    thresholds = q.codebook.thresholds_tensor(DEVICE)
    auto, _ = turboquant_quantize(x, q.rotation, thresholds, 2, backend="auto")
    reference, _ = naive.encode(x, q.rotation, thresholds, 2)
    assert_matches(auto, reference, name="packed codes")

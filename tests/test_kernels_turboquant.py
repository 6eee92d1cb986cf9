"""TurboQuant kernels against their reference (codes and bytes exact, decoded values within the
tolerances below), and the reference against :class:`seqkv.quantizers.TurboQuantMSE`.

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

from seqkv.kernels import KernelBackend, turboquant_dequantize, turboquant_quantize  # noqa: E402
from seqkv.kernels.testing import (  # noqa: E402
    assert_matches,
    filled,
    kernel_device,
    sentinels,
)
from seqkv.kernels.turboquant import naive  # noqa: E402
from seqkv.kernels.turboquant import triton as kernels  # noqa: E402
from seqkv.quantizers import TurboQuantMSE, unpack_bits  # noqa: E402

DEVICE = kernel_device()

# (input dtype, atol, rtol) for decoded values. The kernel performs the reference's operations
# in the same order without FMA contraction, and both round the float32 result to the output
# dtype to nearest even (bf16 by hand in the kernel, see kernels/common/triton.py), so decoded
# values agree to the bit: every tolerance is 0.
DTYPES = [
    (torch.float32, 0.0, 0.0),
    (torch.float16, 0.0, 0.0),
    (torch.bfloat16, 0.0, 0.0),
]


def _quantizer(dim: int, bits: int, seed: int) -> TurboQuantMSE:
    return TurboQuantMSE(dim, bits, rotation="hadamard", seed=seed)


def _rows(n: int, dim: int, dtype: torch.dtype, scale: float, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=generator) * scale  # [N, D]
    if n >= 2:
        x[0] = 0.0  # a zero vector
        x[1] = 0.0
        x[1, seed % dim] = scale  # an axis vector: every rotated coordinate is +-1/sqrt(d)
    return x.to(dtype).to(DEVICE)


def _operands(q: TurboQuantMSE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    assert q.rotation.signs is not None
    return (
        q.rotation.signs.to(DEVICE),
        q.codebook.thresholds_tensor(DEVICE),
        q.codebook.levels_tensor(DEVICE),
    )


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(0, 37),
    log2_dim=st.integers(3, 7),
    bits=st.integers(1, 8),
    case=st.sampled_from(DTYPES),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
    seed=st.integers(0, 3),
)
def test_encode_matches_reference_exactly(
    n: int,
    log2_dim: int,
    bits: int,
    case: tuple[torch.dtype, float, float],
    scale: float,
    seed: int,
) -> None:
    dim = 1 << log2_dim
    q = _quantizer(dim, bits, seed)
    signs, thresholds, _ = _operands(q)
    x = _rows(n, dim, case[0], scale, seed)
    want_packed, want_norms = naive.encode(x, signs, thresholds, bits)
    for fill in sentinels(torch.uint8):
        packed = filled(tuple(want_packed.shape), torch.uint8, DEVICE, fill)
        norms = filled((n,), torch.float32, DEVICE, float("nan"))
        kernels.encode(x, signs, thresholds, bits, packed=packed, norms=norms)
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
def test_decode_matches_reference(
    n: int, log2_dim: int, bits: int, case: tuple[torch.dtype, float, float], seed: int
) -> None:
    dtype, atol, rtol = case
    dim = 1 << log2_dim
    q = _quantizer(dim, bits, seed)
    signs, thresholds, levels = _operands(q)
    packed, norms32 = naive.encode(_rows(n, dim, dtype, 3.0, seed), signs, thresholds, bits)
    norms = norms32.to(torch.float16)
    want = naive.decode(packed, norms, signs, levels, bits, dtype)
    out = filled((n, dim), dtype, DEVICE, float("nan"))
    kernels.decode(packed, norms, signs, levels, bits, dtype, out=out)
    assert_matches(out, want, atol=atol, rtol=rtol, name=f"decoded {dtype}")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_op_output_interoperates_with_the_quantizer(backend: KernelBackend) -> None:
    q = _quantizer(64, 3, seed=5)
    x = torch.randn(2, 3, 11, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    qx = turboquant_quantize(x, q, backend=backend)
    assert qx.num_bits == q.num_bits_for(tuple(x.shape))
    theirs = q.dequantize(qx)
    ours = turboquant_dequantize(qx, q, backend=backend)
    assert_matches(ours, theirs, atol=0.0, rtol=0.0, name="ours vs quantizer.dequantize")
    mse = float((ours - x).square().sum() / x.square().sum())
    assert mse < 0.05  # 3-bit TurboQuant: ~0.034 (lloyd_max reference values)


def test_reference_codes_agree_with_the_quantizer_except_at_thresholds() -> None:
    """The reference differs from TurboQuantMSE only in rounding (tree-summed norm, multiply by
    1/sqrt(d)): a code may differ only for a coordinate within float32 noise of a threshold."""
    q = _quantizer(128, 4, seed=0)
    x = torch.randn(2000, 128, generator=torch.Generator().manual_seed(7))
    signs, thresholds, _ = _operands(q)
    packed, norms = naive.encode(x.to(DEVICE), signs, thresholds, 4)
    ours = unpack_bits(packed.cpu(), 4, x.numel()).reshape(x.shape)
    theirs = q.quantize(x)
    assert theirs.codes is not None
    differ = ours != theirs.codes.unpack()
    unit = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    rotated = q.rotation.forward(unit)
    distance = (rotated.unsqueeze(-1) - q.codebook.thresholds_tensor()).abs().amin(dim=-1)
    assert int(differ.sum()) <= 5, int(differ.sum())
    assert bool((distance[differ] < 1e-6).all())
    assert_matches(norms.cpu().to(torch.float16), theirs.scales, name="fp16 norms")


def test_orthogonal_rotation_is_refused() -> None:
    q = TurboQuantMSE(16, 2, rotation="orthogonal")
    with pytest.raises(ValueError, match="rotation='hadamard'"):
        turboquant_quantize(torch.randn(3, 16), q, backend="torch")


def test_wrong_dim_is_refused() -> None:
    with pytest.raises(ValueError, match="dim=16"):
        turboquant_quantize(torch.randn(3, 8), _quantizer(16, 2, 0), backend="torch")


def test_non_finite_input_is_refused() -> None:
    x = torch.randn(3, 16)
    x[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        turboquant_quantize(x, _quantizer(16, 2, 0), backend="torch")


def test_kernel_refuses_a_dim_below_eight_when_forced() -> None:
    x = torch.randn(3, 4).to(DEVICE)
    with pytest.raises(ValueError, match=r"outside 8\.\.1024"):
        turboquant_quantize(x, _quantizer(4, 2, 0), backend="triton")


def test_auto_falls_back_for_a_dim_below_eight() -> None:
    q = _quantizer(4, 2, 0)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    auto = turboquant_quantize(x, q, backend="auto")
    reference = turboquant_quantize(x, q, backend="torch")
    assert auto.codes is not None and reference.codes is not None
    assert_matches(auto.codes.data, reference.codes.data, name="packed codes")

"""The quantizers route through the kernel ops when the dispatch point asks for kernels.

On CUDA (``SEQKV_KERNELS`` unset or ``auto``) that is every call; here the backend is forced to
``triton`` so the same route runs on Triton's CPU interpreter. On CPU under ``auto`` the
quantizers keep their own torch code.
"""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from seqkv.kernels import (  # noqa: E402
    kivi_dequantize,
    kivi_quantize,
    turboquant_dequantize,
    turboquant_quantize,
)
from seqkv.kernels.dispatch import prefers_kernel  # noqa: E402
from seqkv.kernels.testing import kernel_device  # noqa: E402
from seqkv.quantizers import KIVI, TurboQuantMSE  # noqa: E402

DEVICE = kernel_device()


def test_prefers_kernel_follows_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.zeros(2)
    monkeypatch.setenv("SEQKV_KERNELS", "torch")
    assert not prefers_kernel(cpu)
    monkeypatch.setenv("SEQKV_KERNELS", "triton")
    assert prefers_kernel(cpu)
    monkeypatch.setenv("SEQKV_KERNELS", "auto")
    assert prefers_kernel(cpu) is False


def test_turboquant_routes_through_the_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    quantizer = TurboQuantMSE(dim=64, bits=3, rotation="hadamard")
    x = torch.randn(2, 3, 40, 64, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    monkeypatch.setenv("SEQKV_KERNELS", "torch")
    own = quantizer.quantize(x)
    monkeypatch.setenv("SEQKV_KERNELS", "triton")
    routed = quantizer.quantize(x)
    expected = turboquant_quantize(x, quantizer, backend="triton")
    assert routed.codes is not None and expected.codes is not None and own.codes is not None
    assert torch.equal(routed.codes.data, expected.codes.data)
    assert routed.scales is not None and expected.scales is not None
    assert torch.equal(routed.scales, expected.scales)
    assert torch.equal(quantizer.dequantize(routed),
                       turboquant_dequantize(routed, quantizer, backend="triton"))
    # The kernel differs from the quantizer's own code only within float rounding of a
    # threshold (kernels/turboquant/__init__.py, invariant 5).
    differing = (routed.codes.unpack() != own.codes.unpack()).float().mean().item()
    assert differing < 1e-3


def test_kivi_routes_through_its_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    quantizer = KIVI(dim=64, bits=2, role="key", group_size=32, residual_length=16)
    x = torch.randn(3, 70, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    monkeypatch.setenv("SEQKV_KERNELS", "torch")
    own = quantizer.quantize(x)
    monkeypatch.setenv("SEQKV_KERNELS", "triton")
    routed = quantizer.quantize(x)
    expected = kivi_quantize(x, quantizer, backend="triton")
    assert routed.codes is not None and expected.codes is not None and own.codes is not None
    assert torch.equal(routed.codes.data, expected.codes.data)
    assert torch.equal(routed.codes.data, own.codes.data)
    assert torch.equal(quantizer.dequantize(routed),
                       kivi_dequantize(routed, quantizer, backend="triton"))

"""The quantizers route through the kernel ops when the dispatch point asks for kernels.

On CUDA (``SEQKV_KERNELS`` unset or ``auto``) that is every call; here the backend is forced to
``triton`` so the same route runs on Triton's CPU interpreter. On CPU under ``auto`` the
quantizers keep their own torch code.
"""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import seqkv.kernels as kernels  # noqa: E402
from seqkv.kernels import kivi_quantize, turboquant_quantize  # noqa: E402
from seqkv.kernels.dispatch import prefers_kernel  # noqa: E402
from seqkv.kernels.testing import kernel_device  # noqa: E402
from seqkv.quantizers import KIVI, QuantizedTensor, TurboQuantMSE  # noqa: E402

DEVICE = kernel_device()


def test_prefers_kernel_follows_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.zeros(2)
    monkeypatch.setenv("SEQKV_KERNELS", "torch")
    assert not prefers_kernel(cpu)
    monkeypatch.setenv("SEQKV_KERNELS", "triton")
    assert prefers_kernel(cpu)
    monkeypatch.setenv("SEQKV_KERNELS", "auto")
    assert prefers_kernel(cpu) is False


def _routed_and_own(monkeypatch: pytest.MonkeyPatch, quantizer: TurboQuantMSE | KIVI,
                    x: torch.Tensor, ops: tuple[str, str]) -> tuple[QuantizedTensor,
                                                                    QuantizedTensor, list[str]]:
    """Quantize and dequantize ``x`` with the backend forced to torch, then to triton, while
    recording which kernel ops (``seqkv.kernels.<op>``) the quantizer called."""
    calls: list[str] = []
    for name in ops:
        op = getattr(kernels, name)

        def spy(*args: Any, _op: Any = op, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _op(*args, **kwargs)

        monkeypatch.setattr(kernels, name, spy)
    monkeypatch.setenv("SEQKV_KERNELS", "torch")
    own = quantizer.quantize(x)
    quantizer.dequantize(own)
    assert calls == []  # the torch switch keeps the quantizer's own code
    monkeypatch.setenv("SEQKV_KERNELS", "triton")
    routed = quantizer.quantize(x)
    quantizer.dequantize(routed)
    return routed, own, calls


def test_turboquant_routes_through_the_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    quantizer = TurboQuantMSE(dim=64, bits=3, rotation="hadamard")
    x = torch.randn(2, 3, 40, 64, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    routed, own, calls = _routed_and_own(monkeypatch, quantizer, x,
                                         ("turboquant_quantize", "turboquant_dequantize"))
    assert calls == ["turboquant_quantize", "turboquant_dequantize"]
    expected = turboquant_quantize(x, quantizer, backend="triton")
    assert routed.codes is not None and expected.codes is not None and own.codes is not None
    assert torch.equal(routed.codes.data, expected.codes.data)
    # The kernel differs from the quantizer's own code only within float rounding of a
    # threshold (kernels/turboquant/__init__.py, invariant 5).
    differing = (routed.codes.unpack() != own.codes.unpack()).float().mean().item()
    assert differing < 1e-3


def test_kivi_routes_through_its_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    quantizer = KIVI(dim=64, bits=2, role="key", group_size=32, residual_length=16)
    x = torch.randn(3, 70, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    routed, own, calls = _routed_and_own(monkeypatch, quantizer, x,
                                         ("kivi_quantize", "kivi_dequantize"))
    assert calls == ["kivi_quantize", "kivi_dequantize"]
    expected = kivi_quantize(x, quantizer, backend="triton")
    assert routed.codes is not None and expected.codes is not None and own.codes is not None
    assert torch.equal(routed.codes.data, expected.codes.data)
    assert torch.equal(routed.codes.data, own.codes.data)

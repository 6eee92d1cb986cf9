"""Each kernel beside its torch reference, on tiny inputs (the provider axis is the backend).

Run: ``scripts/bench.sh benchmarks/bench_kernels.py``. On a CPU the Triton provider is Triton's
interpreter ("triton-interpret"), which measures that the kernel runs, not how fast it is on a
GPU; ``benchmarks/gpu_kernels.py`` (run by ``scripts/gpu_check.sh``) measures GPU throughput.
Inputs are tiny so that the one-shot run inside the test suite stays quick.
"""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

from collections.abc import Callable  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from pytest_benchmark.fixture import BenchmarkFixture  # noqa: E402

from seqkv.kernels import (  # noqa: E402
    KernelBackend,
    frequency_tables,
    kivi_dequantize,
    kivi_quantize,
    residual_dequantize,
    residual_quantize,
    topk_expectation,
    turboquant_dequantize,
    turboquant_quantize,
)
from seqkv.kernels.testing import kernel_device  # noqa: E402
from seqkv.quantizers import KIVI, TurboQuantMSE  # noqa: E402

DEVICE = kernel_device()
TRITON_PROVIDER = "triton-interpret" if DEVICE.type == "cpu" else "triton"
PROVIDERS: dict[str, KernelBackend] = {"torch": "torch", TRITON_PROVIDER: "triton"}
SHAPE = (1, 2, 64, 64)  # [B, H, T, D]


def _cache() -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).half().to(DEVICE)


def _turboquant_quantize(backend: KernelBackend) -> Callable[[], object]:
    q, x = TurboQuantMSE(64, 3, rotation="hadamard"), _cache()
    return lambda: turboquant_quantize(x, q, backend=backend)


def _turboquant_dequantize(backend: KernelBackend) -> Callable[[], object]:
    q, x = TurboQuantMSE(64, 3, rotation="hadamard"), _cache()
    qx = turboquant_quantize(x, q, backend="torch")
    return lambda: turboquant_dequantize(qx, q, backend=backend)


def _kivi_quantize(backend: KernelBackend) -> Callable[[], object]:
    q, x = KIVI(64, 2, role="key", residual_length=16), _cache()
    return lambda: kivi_quantize(x, q, backend=backend)


def _kivi_dequantize(backend: KernelBackend) -> Callable[[], object]:
    q, x = KIVI(64, 2, role="value", residual_length=16), _cache()
    qx = kivi_quantize(x, q, backend="torch")
    return lambda: kivi_dequantize(qx, q, backend=backend)


def _residual_quantize(backend: KernelBackend) -> Callable[[], object]:
    prediction = _cache().float()
    target = prediction + 1e-4 * torch.randn_like(prediction)
    return lambda: residual_quantize(target, prediction, 1e-4, backend=backend)


def _residual_dequantize(backend: KernelBackend) -> Callable[[], object]:
    prediction = _cache().float()
    symbols = residual_quantize(prediction + 1e-4, prediction, 1e-4, backend="torch").symbols
    return lambda: residual_dequantize(prediction, symbols, 1e-4, backend=backend)


def _topk_expectation(backend: KernelBackend) -> Callable[[], object]:
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(64, 8, generator=generator).to(DEVICE)
    candidates = torch.randn(64, 8, 64, generator=generator).half().to(DEVICE)
    return lambda: topk_expectation(probs, candidates, backend=backend)


def _frequency_tables(backend: KernelBackend) -> Callable[[], object]:
    logits = torch.randn(4, 2048, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    return lambda: frequency_tables(logits, backend=backend)


OPS: dict[str, Callable[[KernelBackend], Callable[[], object]]] = {
    "turboquant_quantize": _turboquant_quantize,
    "turboquant_dequantize": _turboquant_dequantize,
    "kivi_quantize": _kivi_quantize,
    "kivi_dequantize": _kivi_dequantize,
    "residual_quantize": _residual_quantize,
    "residual_dequantize": _residual_dequantize,
    "topk_expectation": _topk_expectation,
    "frequency_tables": _frequency_tables,
}


@pytest.mark.parametrize("provider", list(PROVIDERS))
@pytest.mark.parametrize("op", list(OPS))
def test_kernel(benchmark: BenchmarkFixture, op: str, provider: str) -> None:
    run = OPS[op](PROVIDERS[provider])
    benchmark.extra_info.update(op=op, provider=provider, device=str(DEVICE))
    benchmark(run)

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
    absmax_dequantize,
    absmax_quantize,
    kivi_dequantize,
    kivi_quantize,
    topk_expectation,
    turboquant_dequantize,
    turboquant_quantize,
)
from seqkv.kernels.testing import kernel_device  # noqa: E402
from seqkv.quantizers import TurboQuantMSE  # noqa: E402
from seqkv.quantizers.rotation import RotationKind  # noqa: E402

DEVICE = kernel_device()
TRITON_PROVIDER = "triton-interpret" if DEVICE.type == "cpu" else "triton"
PROVIDERS: dict[str, KernelBackend] = {"torch": "torch", TRITON_PROVIDER: "triton"}
SHAPE = (1, 2, 64, 64)  # [B, H, T, D]


def _cache() -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).half().to(DEVICE)


def _rows() -> torch.Tensor:
    return _cache().reshape(-1, SHAPE[-1])  # [B * H * T, D]


def _turboquant_quantize(rotation: RotationKind) -> Callable[[KernelBackend], Callable[[], object]]:
    def build(backend: KernelBackend) -> Callable[[], object]:
        q, x = TurboQuantMSE(64, 3, rotation=rotation), _rows()
        thresholds = q.codebook.thresholds_tensor(DEVICE)
        return lambda: turboquant_quantize(x, q.rotation, thresholds, 3, backend=backend)

    return build


def _turboquant_dequantize(rotation: RotationKind
                           ) -> Callable[[KernelBackend], Callable[[], object]]:
    def build(backend: KernelBackend) -> Callable[[], object]:
        q, x = TurboQuantMSE(64, 3, rotation=rotation), _rows()
        thresholds, levels = q.codebook.thresholds_tensor(DEVICE), q.codebook.levels_tensor(DEVICE)
        packed, norms = turboquant_quantize(x, q.rotation, thresholds, 3, backend="torch")
        return lambda: turboquant_dequantize(packed, norms.half(), q.rotation, levels, 3,
                                             torch.float16, backend=backend)

    return build


def _kivi_quantize(backend: KernelBackend) -> Callable[[], object]:
    head = _cache().reshape(-1, *SHAPE[-2:])  # [B * H, T, D]
    return lambda: kivi_quantize(head, "tokens", 32, 2, backend=backend)


def _kivi_dequantize(backend: KernelBackend) -> Callable[[], object]:
    head = _cache().reshape(-1, *SHAPE[-2:])  # [B * H, T, D]
    packed, scales, zeros = kivi_quantize(head, "channels", 32, 2, backend="torch")
    shape = (head.shape[0], head.shape[1], head.shape[2])
    return lambda: kivi_dequantize(packed, scales, zeros, shape, "channels", 32, 2,
                                   torch.float16, backend=backend)


def _absmax_quantize(backend: KernelBackend) -> Callable[[], object]:
    x = _rows()
    return lambda: absmax_quantize(x, "fp8_e4m3", backend=backend)


def _absmax_dequantize(backend: KernelBackend) -> Callable[[], object]:
    codes, scales = absmax_quantize(_rows(), "int8", backend="torch")
    return lambda: absmax_dequantize(codes, scales, SHAPE[-1], "int8", torch.float16,
                                     backend=backend)


def _topk_expectation(backend: KernelBackend) -> Callable[[], object]:
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(8, generator=generator, dtype=torch.float64).to(DEVICE)  # one [k] vector
    candidates = torch.randn(30, 2, 3, 8, 64, generator=generator).to(DEVICE)  # [L, 2, H, k, D]
    return lambda: topk_expectation(probs, candidates, backend=backend)


OPS: dict[str, Callable[[KernelBackend], Callable[[], object]]] = {
    "turboquant_quantize-hadamard": _turboquant_quantize("hadamard"),
    "turboquant_quantize-orthogonal": _turboquant_quantize("orthogonal"),
    "turboquant_dequantize-hadamard": _turboquant_dequantize("hadamard"),
    "turboquant_dequantize-orthogonal": _turboquant_dequantize("orthogonal"),
    "kivi_quantize": _kivi_quantize,
    "kivi_dequantize": _kivi_dequantize,
    "absmax_quantize": _absmax_quantize,
    "absmax_dequantize": _absmax_dequantize,
    "topk_expectation": _topk_expectation,
}


@pytest.mark.parametrize("provider", list(PROVIDERS))
@pytest.mark.parametrize("op", list(OPS))
def test_kernel(benchmark: BenchmarkFixture, op: str, provider: str) -> None:
    run = OPS[op](PROVIDERS[provider])
    benchmark.extra_info.update(op=op, provider=provider, device=str(DEVICE))
    benchmark(run)

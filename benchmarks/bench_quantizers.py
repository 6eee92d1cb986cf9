"""Quantize + dequantize throughput of every per-vector quantizer, with MSE and bits recorded.

Run: ``.venv/bin/python -m pytest benchmarks/bench_quantizers.py --benchmark-enable``.
The provider axis is the quantizer; each row also records, in ``extra_info``, the relative MSE
``||x - xhat||^2 / ||x||^2`` on the benchmark tensor and the stored bits per component
(payload plus side information).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from pytest_benchmark.fixture import BenchmarkFixture

from seqkv.quantizers import FP8E4M3, KIVI, Int8Absmax, Quantizer, TurboQuantMSE, TurboQuantProd

DIM = 128
SHAPE = (1, 8, 1024, DIM)  # [B, H, T, D]: one layer of an 8-KV-head model, 1k tokens

PROVIDERS: dict[str, Callable[[], Quantizer]] = {
    "turboquant_mse-orthogonal-3b": lambda: TurboQuantMSE(DIM, 3, rotation="orthogonal"),
    "turboquant_mse-hadamard-3b": lambda: TurboQuantMSE(DIM, 3, rotation="hadamard"),
    "turboquant_mse-orthogonal-4b": lambda: TurboQuantMSE(DIM, 4, rotation="orthogonal"),
    "turboquant_prod-orthogonal-3b": lambda: TurboQuantProd(DIM, 3, rotation="orthogonal"),
    "kivi-key-2b": lambda: KIVI(DIM, 2, role="key"),
    "kivi-value-2b": lambda: KIVI(DIM, 2, role="value"),
    "int8": lambda: Int8Absmax(DIM),
    "fp8": lambda: FP8E4M3(DIM),
}


@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_quantize_dequantize(benchmark: BenchmarkFixture, provider: str) -> None:
    quantizer = PROVIDERS[provider]()
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).half()

    def round_trip() -> torch.Tensor:
        return quantizer.dequantize(quantizer.quantize(x))

    out = benchmark(round_trip)
    ref = x.float()
    q = quantizer.quantize(x)
    benchmark.extra_info["provider"] = provider
    benchmark.extra_info["relative_mse"] = float(
        (out.float() - ref).square().sum() / ref.square().sum()
    )
    benchmark.extra_info["bits_per_component"] = q.bits_per_component
    benchmark.extra_info["num_bits"] = q.num_bits

"""Quantize + dequantize throughput of every per-vector quantizer, with MSE and bits recorded.

Run: ``.venv/bin/python -m pytest benchmarks/bench_quantizers.py --benchmark-enable``.
The provider axis is the quantizer; each row also records, in ``extra_info``, the relative MSE
``||x - xhat||^2 / ||x||^2`` on the benchmark tensor and the stored bits per component
(payload plus side information). On a CPU every quantizer runs its kernel op's torch reference
(``seqkv.kernels``); on a GPU, with the tensor moved there, its Triton kernel.

``python benchmarks/bench_quantizers.py --figures`` prints the quantizer figures the kernel
refactor was checked against (JSON, deterministic, about 30 s on a loaded 2-core CPU): the
TurboQuant distortion on random unit vectors (``python -m research.bench quant``'s measurement, both
rotations, d = 64), TurboQuant_prod's inner-product distortion, the MSE of every quantizer on a
fixed random tensor, and every quantizer's exact stored bits on a fixed shape. Only public API
is used, so the same script measures any commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

import pytest
import torch
from pytest_benchmark.fixture import BenchmarkFixture

from research.bench.distortion import turboquant_mse_table, turboquant_prod_ip_table
from seqkv.quantizers import (
    FP8E4M3,
    KIVI,
    Int8Absmax,
    Quantizer,
    QuantizerName,
    TurboQuantMSE,
    TurboQuantProd,
    make_quantizer,
)

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


FIGURE_SHAPE = (2, 3, 300, 64)  # [B, H, T, D]: KIVI keeps its 128-token window, 172 quantized
FigureValue = float | dict[str, float] | dict[str, int]


def figures() -> dict[str, FigureValue]:
    """The before/after figures of the kernel refactor (see the module docstring)."""
    out: dict[str, FigureValue] = {
        "turboquant_mse_orthogonal_d64": turboquant_mse_table(dims=(64,))["64"],
        "turboquant_mse_hadamard_d64": turboquant_mse_table(dims=(64,), rotation="hadamard")["64"],
        "turboquant_prod_ip_d64": turboquant_prod_ip_table(dims=(64,))["64"],
    }
    x = torch.randn(FIGURE_SHAPE, generator=torch.Generator().manual_seed(0))
    bits: dict[str, int] = {}
    names: list[QuantizerName] = ["turboquant_mse", "turboquant_prod", "kivi", "int8", "fp8"]
    for name in names:
        for b in (8,) if name in ("int8", "fp8") else (1, 2, 3, 4):
            for rotation in ("orthogonal", "hadamard") if name.startswith("turbo") else (None,):
                for role in ("key", "value") if name == "kivi" else ("key",):
                    quantizer = make_quantizer(name, 64, b, rotation=rotation or "orthogonal",
                                               role=role)
                    label = "-".join(str(p) for p in (name, b, rotation, role if name == "kivi"
                                                      else None) if p is not None)
                    q = quantizer.quantize(x)
                    assert q.num_bits == quantizer.num_bits_for(FIGURE_SHAPE)
                    bits[label] = q.num_bits
                    out[f"mse {label}"] = float((quantizer.dequantize(q) - x).square().mean())
    out["bits"] = bits
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="quantizer figures (see the module docstring)")
    parser.add_argument("--figures", action="store_true", required=True)
    parser.parse_args(argv)
    json.dump(figures(), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Kernel vs reference throughput on a GPU, as GB/s and as a fraction of peak memory bandwidth.

Run by ``scripts/gpu_check.sh`` (``python benchmarks/gpu_kernels.py``). Every op in
``seqkv.kernels`` is memory-bound, so the figure of merit is bandwidth: for each op and each
provider (``torch``: the op's ``naive.py``; ``triton``: its ``triton.py``) it times one call on a
KV-cache-sized input and reports ``compulsory bytes / time``. The backend functions are timed,
not the dispatching op functions, whose input checks read the input once more.

Compulsory bytes count every input read once and every output written once (the minimum any
implementation must move). An implementation that reads an input twice (the KIVI kernel) is
charged the same bytes, so its figure is lower, honestly. The orthogonal TurboQuant rotation is
a ``[D, D]`` float32 matrix product per vector: ``D`` flops per byte of fp16 input (128 at
``D = 128``), above the ~14 flops per byte at which an H100/H200's non-tensor-core float32
rate meets its bandwidth, so that row is bound by arithmetic, not bandwidth, and its fraction
of peak bandwidth is low by design. The fraction is of the device's peak DRAM bandwidth from
:data:`PEAK_BANDWIDTH` (override with ``--peak-tbps``).

Before timing, each op's kernel output is compared with the reference output on the same input
(integer outputs must be equal, except TurboQuant's orthogonal codes, where a code within
float32 rounding of a threshold may differ and the column counts them; the column says
``exact``, the largest float difference, or the count of differing codes).

CPU-side parts (the bandwidth table, byte counts, timing on the CPU, the markdown table) are
tested by ``tests/test_kernels_gpu_report.py`` with ``--device cpu --scale tiny``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

from seqkv.kernels import AbsmaxFormat
from seqkv.kernels.common.bitpack import unpack_bits
from seqkv.kernels.testing import compare
from seqkv.quantizers import TurboQuantMSE
from seqkv.quantizers.rotation import RotationKind


@dataclass(frozen=True)
class PeakBandwidth:
    """Peak DRAM bandwidth of a GPU model, matched by a substring of its CUDA device name."""

    match: str
    terabytes_per_second: float
    source: str


PEAK_BANDWIDTH: tuple[PeakBandwidth, ...] = (
    # NOTE: the first entry whose `match` occurs in the device name wins, so variants come first.
    PeakBandwidth("H200", 4.8, "NVIDIA H200 Tensor Core GPU datasheet (141 GB HBM3e, 4.8 TB/s)"),
    PeakBandwidth("H100 NVL", 3.9, "NVIDIA H100 datasheet, H100 NVL (94 GB HBM3, 3.9 TB/s)"),
    PeakBandwidth("H100 PCIe", 2.0, "NVIDIA H100 datasheet, H100 PCIe (80 GB HBM2e, 2.0 TB/s)"),
    PeakBandwidth("H100", 3.35, "NVIDIA H100 datasheet, H100 SXM (80 GB HBM3, 3.35 TB/s)"),
    PeakBandwidth("A100-SXM4-80GB", 2.039, "NVIDIA A100 datasheet, 80 GB SXM (2,039 GB/s)"),
    PeakBandwidth("A100 80GB PCIe", 1.935, "NVIDIA A100 datasheet, 80 GB PCIe (1,935 GB/s)"),
    PeakBandwidth("A100", 1.555, "NVIDIA A100 datasheet, 40 GB (1,555 GB/s)"),
    PeakBandwidth("L40S", 0.864, "NVIDIA L40S datasheet (864 GB/s)"),
    PeakBandwidth("A10G", 0.6, "NVIDIA A10G (AWS G5) specification (600 GB/s)"),
    PeakBandwidth("L4", 0.3, "NVIDIA L4 datasheet (300 GB/s)"),
)


def peak_bandwidth(device_name: str) -> PeakBandwidth | None:
    """The table entry for a CUDA device name, e.g. ``"NVIDIA H100 80GB HBM3"``; None if unknown.

    >>> peak_bandwidth("NVIDIA H100 80GB HBM3").terabytes_per_second
    3.35
    """
    for entry in PEAK_BANDWIDTH:
        if entry.match.lower() in device_name.lower():
            return entry
    return None


@dataclass(frozen=True)
class Case:
    """One op at one size: how to run it on a backend, and what it must move at least."""

    op: str
    shape: str
    compulsory_bytes: int
    run: Callable[[str], object]
    """Runs the op on a provider, ``"torch"`` or ``"triton"``."""
    codes: Callable[[object], torch.Tensor] | None = None
    """For ops whose codes may differ at thresholds: the unpacked codes of a result, which are
    then compared by count (:func:`agreement`); ``None``: every output must match exactly."""


@dataclass(frozen=True)
class Row:
    """One measured (op, provider) pair."""

    op: str
    provider: str
    shape: str
    compulsory_bytes: int
    milliseconds: float
    agreement: str

    @property
    def gigabytes_per_second(self) -> float:
        return self.compulsory_bytes / (self.milliseconds * 1e-3) / 1e9

    def fraction_of_peak(self, peak: PeakBandwidth | None) -> float | None:
        if peak is None:
            return None
        return self.gigabytes_per_second / (peak.terabytes_per_second * 1e3)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _backend(op: str, provider: str) -> ModuleType:
    """``seqkv.kernels.<op>.naive`` (provider ``torch``) or ``.triton`` (provider ``triton``)."""
    return importlib.import_module(
        f"seqkv.kernels.{op}.{'naive' if provider == 'torch' else 'triton'}"
    )


def _turboquant_cases(vectors: torch.Tensor, rotation: RotationKind, shape: str) -> list[Case]:
    """Encode and decode of 4-bit TurboQuant_mse rows ``[N, D]`` with one rotation."""
    device, dim = vectors.device, vectors.shape[-1]
    tq = TurboQuantMSE(dim, 4, rotation=rotation)
    thresholds = tq.codebook.thresholds_tensor(device)
    levels = tq.codebook.levels_tensor(device)
    packed, norms = _backend("turboquant", "torch").encode(vectors, tq.rotation, thresholds, 4)
    norms16 = norms.half()

    def codes(result: object) -> torch.Tensor:
        assert isinstance(result, tuple) and isinstance(result[0], torch.Tensor)
        return unpack_bits(result[0].cpu(), 4, vectors.numel())

    def encode(provider: str) -> object:
        return _backend("turboquant", provider).encode(vectors, tq.rotation, thresholds, 4)

    def decode(provider: str) -> object:
        return _backend("turboquant", provider).decode(packed, norms16, tq.rotation, levels, 4,
                                                       torch.float16)

    return [
        Case(f"turboquant encode 4b {rotation}", shape, _nbytes(vectors, packed, norms), encode,
             codes=codes if rotation == "orthogonal" else None),
        Case(f"turboquant decode 4b {rotation}", shape, _nbytes(packed, norms16, vectors), decode),
    ]


def _absmax_cases(vectors: torch.Tensor, fmt: AbsmaxFormat, shape: str) -> list[Case]:
    """Quantize and dequantize of rows ``[N, D]`` to one 8-bit format."""
    dim = vectors.shape[-1]
    codes, scales = _backend("absmax", "torch").quantize(vectors, fmt)

    def quantize(provider: str) -> object:
        return _backend("absmax", provider).quantize(vectors, fmt)

    def dequantize(provider: str) -> object:
        return _backend("absmax", provider).dequantize(codes, scales, dim, fmt, torch.float16)

    return [
        Case(f"absmax quantize {fmt}", shape, _nbytes(vectors, codes, scales), quantize),
        Case(f"absmax dequantize {fmt}", shape, _nbytes(codes, scales, vectors), dequantize),
    ]


def build_cases(device: torch.device, scale: str) -> list[Case]:
    """The benchmark inputs: ``"full"`` is one layer of a KV cache, 8 sequences of 4k tokens
    (64 MiB fp16); ``"tiny"`` the same ops at a size the CPU runs in milliseconds (for tests).

    Each case calls the backend functions (``naive.py`` against ``triton.py``) directly, not the
    dispatching op functions, whose input validation reads the input once more.
    """
    full = scale == "full"
    batch, heads, tokens, dim = (8, 8, 4096, 128) if full else (1, 2, 48, 16)
    rows, k = (32_768, 8) if full else (64, 4)
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device)

    cache = randn(batch * heads, tokens, dim).half()  # [B * H, T, D]
    shape = f"[{batch}, {heads}, {tokens}, {dim}] fp16"
    vectors = cache.reshape(-1, dim)  # [N, D]
    cases: list[Case] = []

    for rotation in ("hadamard", "orthogonal"):
        cases.extend(_turboquant_cases(vectors, rotation, shape))
    kivi_key = _backend("kivi", "torch").quantize_head(cache, "tokens", 32, 2)
    cases.append(Case(
        "kivi quantize 2b key", shape, _nbytes(cache, *kivi_key),
        lambda p: _backend("kivi", p).quantize_head(cache, "tokens", 32, 2)))
    kivi_value = _backend("kivi", "torch").quantize_head(cache, "channels", 32, 2)
    dims = (batch * heads, tokens, dim)
    cases.append(Case(
        "kivi dequantize 2b value", shape, _nbytes(*kivi_value, cache),
        lambda p: _backend("kivi", p).dequantize_head(*kivi_value, dims, "channels", 32, 2,
                                                      torch.float16)))

    for fmt in ("int8", "fp8_e4m3"):
        cases.extend(_absmax_cases(vectors, fmt, shape))
    probs = torch.rand(rows, k, generator=generator).to(device)
    candidates = randn(rows, k, dim).half()
    cases.append(Case(
        "topk_expectation", f"[{rows}, {k}, {dim}] fp16",
        _nbytes(probs, candidates) + rows * dim * 2,
        lambda p: _backend("topk_expectation", p).expectation(probs, candidates)))
    return cases


def _outputs(result: object) -> list[torch.Tensor]:
    """The tensors a backend function returned, in order, for comparing two backends."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, tuple) and all(isinstance(t, torch.Tensor) for t in result):
        return list(result)
    raise TypeError(f"unexpected result {type(result).__name__}")


def agreement(kernel: object, reference: object,
              codes: Callable[[object], torch.Tensor] | None = None) -> str:
    """``"exact"``, or the worst mismatch between two results of one op.

    With ``codes`` (ops whose codes may differ at thresholds), differing codes are counted
    instead: at most one in 10,000 is reported as agreement, more as a mismatch; the other
    outputs must still match exactly (floats up to a reported difference).
    """
    worst = 0.0
    differing = ""
    for index, (mine, want) in enumerate(zip(_outputs(kernel), _outputs(reference),
                                             strict=True)):
        if codes is not None and index == 0:
            ours, theirs = codes(kernel), codes(reference)
            count = int((ours != theirs).sum())
            if count * 10_000 > ours.numel():
                return f"MISMATCH: {count} of {ours.numel()} codes differ"
            if count:
                differing = f"{count} of {ours.numel()} codes at thresholds"
            continue
        result = compare(mine, want)
        if result.ok:
            continue
        if not mine.dtype.is_floating_point or result.nan_disagreements or (
            result.inf_disagreements
        ):
            return f"MISMATCH: {result.message()}"
        worst = max(worst, result.max_abs_diff)
    parts = [differing] if differing else []
    if worst:
        parts.append(f"max |diff| {worst:.2g}")
    return "; ".join(parts) if parts else "exact"


def time_call(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` calls, after warm-up (compilation)."""
    for _ in range(3):
        fn()
    samples: list[float] = []
    if device.type == "cuda":
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def measure(cases: Sequence[Case], providers: Sequence[str], device: torch.device,
            repeats: int) -> list[Row]:
    rows: list[Row] = []
    for case in cases:
        reference = case.run("torch")
        for provider in providers:
            check = ("reference" if provider == "torch"
                     else agreement(case.run(provider), reference, case.codes))
            ms = time_call(lambda p=provider, c=case: c.run(p), device, repeats)
            rows.append(Row(case.op, provider, case.shape, case.compulsory_bytes, ms, check))
    return rows


def render_markdown(rows: Sequence[Row], device_name: str, peak: PeakBandwidth | None) -> str:
    """The report: a header naming the device and the peak's source, then one row per pair."""
    if peak is None:
        head = f"device: {device_name}; peak bandwidth unknown (pass --peak-tbps)"
    else:
        head = (f"device: {device_name}; peak {peak.terabytes_per_second:g} TB/s "
                f"({peak.source})")
    lines = [
        head,
        "",
        "| op | provider | input | MB moved | ms | GB/s | % of peak | vs reference |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        fraction = row.fraction_of_peak(peak)
        percent = "n/a" if fraction is None else f"{100 * fraction:.1f}"
        lines.append(
            f"| {row.op} | {row.provider} | {row.shape} | {row.compulsory_bytes / 1e6:.3f} | "
            f"{row.milliseconds:.3f} | {row.gigabytes_per_second:.1f} | {percent} | "
            f"{row.agreement} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--scale", default="full", choices=["full", "tiny"])
    parser.add_argument("--providers", default="torch,triton",
                        help="comma-separated subset of torch,triton")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--peak-tbps", type=float, default=None,
                        help="peak memory bandwidth in TB/s, for a device not in the table")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device; use --device cpu", file=sys.stderr)
        return 2
    providers = args.providers.split(",")
    for name in providers:
        if name not in ("torch", "triton"):
            parser.error(f"unknown provider {name!r}")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_bandwidth(device_name)
    if args.peak_tbps is not None:
        peak = PeakBandwidth(device_name, args.peak_tbps, "--peak-tbps")
    rows = measure(build_cases(device, args.scale), providers, device, args.repeats)
    print(render_markdown(rows, device_name, peak))
    return 1 if any(row.agreement.startswith("MISMATCH") for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

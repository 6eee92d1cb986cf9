"""The CPU-side parts of ``benchmarks/gpu_kernels.py`` (which ``scripts/gpu_check.sh`` runs on a
GPU): the bandwidth table, byte accounting, the agreement column and the report, plus a tiny run
on the CPU through ``main``."""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402

from benchmark_scripts import load_benchmark  # noqa: E402

gpu = load_benchmark("gpu_kernels")


@pytest.mark.parametrize(
    ("name", "tbps"),
    [
        ("NVIDIA H100 80GB HBM3", 3.35),
        ("NVIDIA H100 PCIe", 2.0),
        ("NVIDIA H100 NVL", 3.9),
        ("NVIDIA H200", 4.8),
        ("NVIDIA A100-SXM4-80GB", 2.039),
        ("NVIDIA A100-SXM4-40GB", 1.555),
        ("NVIDIA L4", 0.3),
        ("NVIDIA L40S", 0.864),
    ],
)
def test_peak_bandwidth_by_device_name(name: str, tbps: float) -> None:
    entry = gpu.peak_bandwidth(name)
    assert entry is not None and entry.terabytes_per_second == tbps and entry.source


def test_unknown_device_has_no_peak() -> None:
    assert gpu.peak_bandwidth("Some Future GPU") is None


def test_row_figures() -> None:
    row = gpu.Row("op", "triton", "[1]", compulsory_bytes=3_350_000_000, milliseconds=2.0,
                  agreement="exact")
    assert row.gigabytes_per_second == pytest.approx(1675.0)
    assert row.fraction_of_peak(gpu.peak_bandwidth("H100 SXM")) == pytest.approx(0.5)
    assert row.fraction_of_peak(None) is None


def test_agreement_column() -> None:
    a = (torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0.5, 1.0]))
    b = (torch.tensor([1, 3], dtype=torch.int32), torch.tensor([0.5, 1.0]))
    assert gpu.agreement(a, a) == "exact"
    assert gpu.agreement(a, b).startswith("MISMATCH")
    assert gpu.agreement(torch.tensor([1.0]), torch.tensor([1.5])) == "max |diff| 0.5"
    assert gpu.agreement(torch.tensor([float("nan")]), torch.tensor([1.0])).startswith("MISMATCH")


def test_agreement_counts_codes_at_thresholds() -> None:
    def codes(result: object) -> torch.Tensor:
        assert isinstance(result, tuple)
        return result[0]

    norms = torch.ones(2)
    few = torch.zeros(20_000, dtype=torch.uint8)
    one_off = few.clone()
    one_off[7] = 1
    assert gpu.agreement((few, norms), (few, norms), codes) == "exact"
    assert gpu.agreement((one_off, norms), (few, norms), codes) == (
        "1 of 20000 codes at thresholds"
    )
    many = few.clone()
    many[:3] = 1
    assert gpu.agreement((many, norms), (few, norms), codes).startswith("MISMATCH: 3 of 20000")
    assert gpu.agreement((one_off, norms + 1), (few, norms), codes) == (
        "1 of 20000 codes at thresholds; max |diff| 1"
    )


def test_markdown_report_golden() -> None:
    rows = [gpu.Row("absmax quantize int8", "triton", "[4] fp32", 8_000_000, 0.01, "exact")]
    peak = gpu.peak_bandwidth("NVIDIA H200")
    assert gpu.render_markdown(rows, "NVIDIA H200", peak).splitlines() == [
        "device: NVIDIA H200; peak 4.8 TB/s (NVIDIA H200 Tensor Core GPU datasheet (141 GB "
        "HBM3e, 4.8 TB/s))",
        "",
        "| op | provider | input | MB moved | ms | GB/s | % of peak | vs reference |",
        "|---|---|---|---:|---:|---:|---:|---|",
        "| absmax quantize int8 | triton | [4] fp32 | 8.000 | 0.010 | 800.0 | 16.7 | exact |",
    ]


def test_tiny_run_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    # With a GPU (scripts/gpu_check.sh) the interpreter is off, so the CPU run is torch only.
    providers = "torch" if torch.cuda.is_available() else "torch,triton"
    assert gpu.main(["--device", "cpu", "--scale", "tiny", "--repeats", "1",
                     "--providers", providers, "--peak-tbps", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "| turboquant encode 4b orthogonal | torch |" in out
    assert "| topk_expectation | torch |" in out
    assert "MISMATCH" not in out
    assert out.count("\n| ") == 1 + 11 * len(providers.split(","))  # the header, then rows

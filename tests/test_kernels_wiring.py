"""Every quantizer computes through a kernel op, and the dispatch decides which implementation
runs: spies on both implementations of each op prove that the torch reference (``naive.py``) is
what runs on CPU tensors, and the Triton kernel (``triton.py``) only on CUDA tensors or when
forced with ``SEQKV_KERNELS=triton`` (here on Triton's CPU interpreter).

A CUDA tensor is simulated by patching :func:`seqkv.kernels.dispatch.on_cuda` (the one place the
dispatch asks where tensors live); on a GPU (``scripts/gpu_check.sh``) the last test runs the
same check with real CUDA tensors.
"""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import importlib  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from seqkv.kernels import ENV_VAR  # noqa: E402
from seqkv.kernels.testing import assert_matches, kernel_device  # noqa: E402
from seqkv.quantizers import (  # noqa: E402
    FP8E4M3,
    KIVI,
    Int8Absmax,
    QuantizedTensor,
    Quantizer,
    TurboQuantMSE,
    TurboQuantProd,
)

IMPLEMENTATIONS = {
    "turboquant": ("encode", "decode"),
    "kivi": ("quantize_head", "dequantize_head"),
    "absmax": ("quantize", "dequantize"),
}
"""For each op, the functions its ``naive.py`` and ``triton.py`` both define."""

CASES: dict[str, tuple[Callable[[], Quantizer], str]] = {
    "turboquant_mse-hadamard": (lambda: TurboQuantMSE(64, 3, rotation="hadamard"), "turboquant"),
    "turboquant_mse-orthogonal": (lambda: TurboQuantMSE(64, 3), "turboquant"),
    "turboquant_prod-hadamard": (lambda: TurboQuantProd(64, 3, rotation="hadamard"),
                                 "turboquant"),
    "turboquant_prod-orthogonal": (lambda: TurboQuantProd(64, 3), "turboquant"),
    "kivi-key": (lambda: KIVI(64, 2, role="key", group_size=8, residual_length=6), "kivi"),
    "kivi-value": (lambda: KIVI(64, 2, role="value", group_size=8, residual_length=6), "kivi"),
    "int8": (lambda: Int8Absmax(64), "absmax"),
    "fp8": (lambda: FP8E4M3(64), "absmax"),
}


def _input() -> torch.Tensor:
    return torch.randn(2, 3, 40, 64, generator=torch.Generator().manual_seed(0)) * 2.0


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Wrap both implementations of every op; each call appends ``"<op>.<impl>.<function>"``."""
    record: list[str] = []
    for op, names in IMPLEMENTATIONS.items():
        for impl in ("naive", "triton"):
            module = importlib.import_module(f"seqkv.kernels.{op}.{impl}")
            for name in names:
                original = getattr(module, name)

                def spy(*args: Any, _f: Any = original, _tag: str = f"{op}.{impl}.{name}",
                        **kwargs: Any) -> Any:
                    record.append(_tag)
                    return _f(*args, **kwargs)

                monkeypatch.setattr(module, name, spy)
    return record


def _round_trip(quantizer: Quantizer, x: torch.Tensor) -> tuple[QuantizedTensor, torch.Tensor]:
    q = quantizer.quantize(x)
    return q, quantizer.dequantize(q)


def _implementations(record: list[str], op: str) -> set[str]:
    assert record, "the quantizer called no kernel op"
    assert {tag.split(".")[0] for tag in record} == {op}, record
    names = {tag.split(".")[2] for tag in record}
    assert names == set(IMPLEMENTATIONS[op]), record  # both quantize and dequantize went through
    return {tag.split(".")[1] for tag in record}


@pytest.mark.parametrize("setting", [None, "auto", "torch"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_reference_runs_on_cpu(monkeypatch: pytest.MonkeyPatch, calls: list[str],
                                   case: str, setting: str | None) -> None:
    if setting is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, setting)
    factory, op = CASES[case]
    _round_trip(factory(), _input())
    assert _implementations(calls, op) == {"naive"}


@pytest.mark.parametrize("case", list(CASES))
def test_triton_runs_when_forced_and_agrees(monkeypatch: pytest.MonkeyPatch, calls: list[str],
                                            case: str) -> None:
    factory, op = CASES[case]
    quantizer, x = factory(), _input().to(kernel_device())
    monkeypatch.setenv(ENV_VAR, "torch")
    want_q, want = _round_trip(quantizer, x)
    calls.clear()
    monkeypatch.setenv(ENV_VAR, "triton")
    got_q, got = _round_trip(quantizer, x)
    assert _implementations(calls, op) == {"triton"}
    assert got_q.num_bits == want_q.num_bits == quantizer.num_bits_for(tuple(x.shape))
    assert got_q.scales is not None and want_q.scales is not None
    if "orthogonal" in case:
        # The dot product's summation order: a code (and, through the MSE stage, a QJL sign)
        # may differ at a threshold (see tests/test_kernels_turboquant.py); norms are exact, and
        # every vector without such a code decodes within float32 rounding (norms ~16 here).
        assert_matches(got_q.scales, want_q.scales, name="norms")
        flipped = torch.zeros(x.shape[:-1], dtype=torch.bool, device=x.device)  # [..., T]
        for field in ("codes", "sketch"):
            mine, theirs = getattr(got_q, field), getattr(want_q, field)
            if mine is not None:
                flipped |= (mine.unpack() != theirs.unpack()).any(dim=-1)
        off = ((got - want).abs() > 1e-4).any(dim=-1)  # [..., T]
        assert not bool((off & ~flipped).any()), float((got - want).abs().max())
        assert float(flipped.float().mean()) < 0.02
        return
    for field in ("codes", "sketch"):
        mine, theirs = getattr(got_q, field), getattr(want_q, field)
        assert (mine is None) == (theirs is None)
        if mine is not None:
            assert_matches(mine.data, theirs.data, name=field)
    for field in ("scales", "zero_points", "residual_norms", "dense"):
        mine, theirs = getattr(got_q, field), getattr(want_q, field)
        if mine is not None:
            assert_matches(mine, theirs, name=field)
    if case.startswith("turboquant_prod"):
        # The QJL term is a library matrix product on both paths; the MSE stage is exact.
        assert_matches(got, want, atol=1e-5, name="decoded")
    else:
        assert_matches(got, want, name="decoded")


@pytest.mark.parametrize("case", list(CASES))
def test_triton_runs_on_cuda_tensors_under_auto(monkeypatch: pytest.MonkeyPatch,
                                                calls: list[str], case: str) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr("seqkv.kernels.dispatch.on_cuda", lambda *tensors: True)
    factory, op = CASES[case]
    _round_trip(factory(), _input().to(kernel_device()))
    assert _implementations(calls, op) == {"triton"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", list(CASES))
def test_triton_runs_on_real_cuda_tensors(monkeypatch: pytest.MonkeyPatch, calls: list[str],
                                          case: str) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    factory, op = CASES[case]
    _round_trip(factory(), _input().cuda())
    assert _implementations(calls, op) == {"triton"}

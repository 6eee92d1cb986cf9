"""The dispatch rules: argument over environment over "auto", read at call time; Triton never
imported by ``import seqkv`` or ``import seqkv.kernels``; clear errors when Triton cannot run."""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from seqkv.kernels import ENV_VAR, KernelUnavailableError, residual_quantize  # noqa: E402
from seqkv.kernels.dispatch import requested_backend, resolve_backend  # noqa: E402

CPU = torch.zeros(3)


def test_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "triton")
    assert requested_backend("torch") == "torch"
    assert resolve_backend("torch", CPU) == "torch"


def test_environment_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert requested_backend() == "auto"
    monkeypatch.setenv(ENV_VAR, " Torch ")
    assert requested_backend() == "torch"
    monkeypatch.setenv(ENV_VAR, "triton")
    assert requested_backend() == "triton"


def test_auto_runs_the_reference_on_cpu_tensors() -> None:
    assert resolve_backend("auto", CPU) == "torch"


def test_auto_falls_back_when_the_kernel_does_not_support_the_input() -> None:
    assert resolve_backend("auto", CPU, unsupported="too wide") == "torch"


def test_unknown_environment_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="SEQKV_KERNELS='cuda' is not a kernel backend"):
        resolve_backend(None, CPU)


def test_unknown_argument_is_refused() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        requested_backend("cuda")  # type: ignore[arg-type]


def test_forced_triton_on_cpu_without_the_interpreter_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(KernelUnavailableError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", CPU)


def test_forced_triton_without_triton_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("seqkv.kernels.dispatch.triton_available", lambda: False)
    with pytest.raises(KernelUnavailableError, match="pip install triton"):
        resolve_backend("triton", CPU)


def test_forced_triton_with_an_unsupported_input_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="does not support this input: too wide"):
        resolve_backend("triton", CPU, unsupported="too wide")


def test_op_functions_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(KernelUnavailableError):
        residual_quantize(torch.zeros(3), torch.zeros(3), 1e-4)
    monkeypatch.setenv(ENV_VAR, "torch")
    assert residual_quantize(torch.zeros(3), torch.zeros(3), 1e-4).num_escapes == 0


BLOCK_TRITON = """
import importlib.abc, sys
class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError("triton is blocked for this test")
        return None
sys.meta_path.insert(0, NoTriton())
"""


def test_seqkv_and_its_kernels_work_without_triton() -> None:
    """With triton made unimportable, ``import seqkv.kernels`` and the torch path still work,
    and none of seqkv's kernel modules was loaded."""
    code = BLOCK_TRITON + (
        "import torch, seqkv, seqkv.kernels as k\n"
        "r = k.residual_quantize(torch.ones(4), torch.zeros(4), 0.1)\n"
        "assert r.symbols.tolist() == [5, 5, 5, 5], r.symbols\n"
        "ours = [m for m in sys.modules if m.startswith('seqkv.kernels') and "
        "(m.endswith('.triton') or m.endswith('._jit'))]\n"
        "print(','.join(ours))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "SEQKV_KERNELS": "auto"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == ""


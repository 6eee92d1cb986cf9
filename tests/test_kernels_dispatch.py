"""The dispatch rules: argument over environment over "auto", read at call time; Triton never
imported by ``import seqkv``, ``import seqkv.kernels`` or a quantizer on the CPU; clear errors
when Triton cannot run; the kernel layer imports nothing from the quantizers."""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import ast  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import seqkv.kernels  # noqa: E402
from seqkv.errors import KernelBackendError, SeqKVError  # noqa: E402
from seqkv.kernels import (  # noqa: E402
    ENV_VAR,
    KernelUnavailableError,
    UnsupportedKernelInputError,
    absmax_quantize,
)
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
    with pytest.raises(KernelBackendError, match="SEQKV_KERNELS='cuda' is not a kernel backend"):
        resolve_backend(None, CPU)


def test_unknown_argument_is_refused() -> None:
    with pytest.raises(KernelBackendError, match="backend must be one of"):
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
    with pytest.raises(UnsupportedKernelInputError, match="does not support this input: too wide"):
        resolve_backend("triton", CPU, unsupported="too wide")


def test_dispatch_errors_are_seqkv_errors() -> None:
    assert issubclass(KernelUnavailableError, SeqKVError)
    assert issubclass(UnsupportedKernelInputError, SeqKVError)


def test_op_functions_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(KernelUnavailableError):
        absmax_quantize(torch.ones(2, 3), "int8")
    monkeypatch.setenv(ENV_VAR, "torch")
    codes, _ = absmax_quantize(torch.ones(2, 3), "int8")
    assert codes.tolist() == [127] * 6


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
    """With triton made unimportable, ``import seqkv.kernels``, its ops and every quantizer still
    work on the CPU, and none of seqkv's kernel modules was loaded."""
    code = BLOCK_TRITON + (
        "import torch, seqkv, seqkv.kernels as k\n"
        "from seqkv.quantizers import make_quantizer\n"
        "codes, _ = k.absmax_quantize(torch.ones(1, 4), 'int8')\n"
        "assert codes.tolist() == [127] * 4, codes\n"
        "x = torch.randn(2, 40, 64)\n"
        "for name, bits in [('turboquant_mse', 3), ('turboquant_prod', 3), ('kivi', 2),\n"
        "                   ('int8', 8), ('fp8', 8)]:\n"
        "    q = make_quantizer(name, 64, bits, residual_length=8)\n"
        "    assert q.dequantize(q.quantize(x)).shape == x.shape\n"
        "ours = [m for m in sys.modules if m.startswith('seqkv.kernels') and "
        "(m.endswith('.triton') or m.endswith('._jit'))]\n"
        "print(','.join(ours))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "SEQKV_KERNELS": "auto"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == ""



def _imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules a source file imports (relative imports resolved)."""
    package = "seqkv." + ".".join(path.relative_to(KERNELS.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


KERNELS = Path(seqkv.kernels.__file__).resolve().parent


@pytest.mark.parametrize("path", sorted(KERNELS.rglob("*.py")), ids=lambda p: p.name)
def test_the_kernel_layer_imports_no_quantizer(path: Path) -> None:
    """Kernels are the lower layer: no module under kernels/ imports seqkv.quantizers (nor any
    seqkv package but seqkv.kernels and the dependency-free seqkv.errors)."""
    ours = {n for n in _imported_modules(path) if n == "seqkv" or n.startswith("seqkv.")}
    outside = {n for n in ours if not n.startswith(("seqkv.kernels", "seqkv.errors"))}
    assert not outside, f"{path.relative_to(KERNELS)} imports {sorted(outside)}"

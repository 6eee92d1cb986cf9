"""native.c computes the torch statement's integers on aarch64 too, bit for bit.

``tests/native/harness.c`` includes ``native.c`` and replays, without Python, the forward calls
and coder tables recorded by ``tests/native_vectors.py`` from ``IntegerForward(backend="torch")``
and ``table.numpy_tables``, comparing every logit, KV pool byte and table entry (see there).
It is cross-compiled for aarch64 twice, as ``native.py`` builds native.c (``-O3 -std=c99 -fwrapv
-ffp-contract=off``, OpenMP where the cross libgomp is there), statically linked:

* ``-march=armv8-a``: no dot product, so native.c's plain C; run under ``qemu-aarch64 -cpu
  cortex-a53`` (a CPU without it: an instruction beyond armv8-a would fault);
* ``-march=armv8.2-a+dotprod``: ``__ARM_FEATURE_DOTPROD``, native.c's NEON ``sdot`` path; run
  under ``qemu-aarch64 -cpu max``;

and natively for each x86-64 path this CPU runs, with the flags ``native.py`` builds it with.
Each runs the int8 predictor (one and two weight planes), the 4-bit one (Q4_1 blocks) and a
Qwen2 with biases: a prefill of two sequences in one pool (37 and 20 tokens, so three spans), two
one-row steps, then a three-row chunk of one sequence, on one and on two threads.

The aarch64 tests need ``aarch64-linux-gnu-gcc`` and ``qemu-aarch64`` (``scripts/cross.sh
install``, run by ``scripts/setup.sh``), and fail, not skip, without them.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from native_vectors import array_spans, write_vectors
from seqkv.models import CausalLM, tiny_random_qwen2
from seqkv.models.integer import IntegerConfig, IntegerForward, native
from seqkv.models.integer.blocks import block_weights

NATIVE_C = Path(native.__file__).with_name("native.c")
HARNESS = Path(__file__).with_name("native") / "harness.c"
# native.py's flags, less -march (chosen per build) and -shared -fPIC (a program here)
FLAGS = ("-O3", "-std=c99", "-fwrapv", "-ffp-contract=off")
CROSS, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
_X86 = platform.machine() in ("x86_64", "AMD64")


@dataclass(frozen=True)
class Build:
    """One compilation of the harness and how to run it."""

    compiler: str
    flags: tuple[str, ...]
    runner: tuple[str, ...]  # the emulator and its options, or () to run it directly
    banner: str  # what the harness must say it was built for (its first line)


# The aarch64 builds with native.py's flags for its two Arm paths, and, on an x86-64 host, one
# build per x86 path that this CPU runs (native.py's flags for each: exactly the libraries it
# loads). The x86 paths this CPU cannot run are built by test_integer_native.py, not run.
BUILDS = {
    "aarch64-scalar": Build(CROSS, (*native._ARM_PATHS["scalar"][0], "-static"),
                            (QEMU, "-cpu", "cortex-a53"), "native.c for aarch64, isa=scalar"),
    "aarch64-neon": Build(CROSS, (*native._ARM_PATHS["neon"][0], "-static"),
                          (QEMU, "-cpu", "max"), "native.c for aarch64, isa=neon"),
    **{f"x86-{isa}": Build("cc", native._X86_PATHS[isa][0], (), f"native.c for x86-64, isa={isa}")
       for isa in native._X86_PATHS if _X86 and isa in native.cpu_isas()},
}


def require_tool(name: str) -> str:
    """The path of ``name``; a failure naming the install script when it is missing."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: run scripts/cross.sh install (as root; "
                    "scripts/setup.sh does) to install the aarch64 cross compiler and qemu-user")
    return found


def _compile(build: Build, target: Path, source: Path = NATIVE_C) -> None:
    compiler = require_tool(build.compiler)
    for tool in build.runner[:1]:
        require_tool(tool)
    command = [compiler, *FLAGS, *build.flags, f'-DSEQKV_NATIVE_C="{source}"', "-o",
               str(target), str(HARNESS), "-lm"]
    # OpenMP where the compiler's libgomp is there (native.py's fallback too)
    for attempt in ([*command[:1], "-fopenmp", *command[1:]], command):
        built = subprocess.run(attempt, capture_output=True, text=True, timeout=600)
        if built.returncode == 0:
            return
    pytest.fail(f"the harness did not build: {' '.join(command)}\n{built.stderr[-4000:]}")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``harness(build, vectors, part)``: the harness built once per build, run on a vector
    file; its output (stdout and stderr). Fails when it does not exit with ``expect``."""
    directory = tmp_path_factory.mktemp("harness")
    built: dict[Path, Path] = {}

    def run(name: str, vectors: Path, part: str = "all", expect: int = 0,
            source: Path = NATIVE_C, key: str = "") -> str:
        """``source`` and ``key``: another native.c (a mutant), built once per key."""
        build = BUILDS[name]
        program = directory / f"harness-{name}{'-' + key if key else ''}"
        if program not in built:
            _compile(build, program, source)
            built[program] = program
        result = subprocess.run([*build.runner, str(program), str(vectors), part, "1", "2"],
                                capture_output=True, text=True, timeout=600)
        output = result.stdout + result.stderr
        assert result.returncode == expect, (
            f"{name} on {vectors.name} ({part}) exited {result.returncode}:\n{output[-6000:]}")
        assert output.startswith(f"harness: {build.banner}"), output[:300]
        return output

    return run


def _tokens(rng: np.random.Generator, count: int) -> list[int]:
    return [int(t) for t in rng.integers(0, 512, count)]


@pytest.fixture(scope="module")
def vectors(tiny_model: CausalLM, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One vector file per predictor: the tiny Llama's int8 integers with one and two weight
    planes, its Q4_1 blocks, and a tiny Qwen2 (biases on q, k, v)."""
    directory = tmp_path_factory.mktemp("vectors")
    engines = {
        "int8": IntegerForward(tiny_model, backend="torch"),
        "int8-planes2": IntegerForward(tiny_model, config=IntegerConfig(weight_planes=2),
                                       backend="torch"),
        "q4": IntegerForward(block_weights(tiny_model), backend="torch"),
        "qwen2-bias": IntegerForward(tiny_random_qwen2(seed=0), backend="torch"),
    }
    paths = {}
    rng = np.random.default_rng(21)
    for name, engine in engines.items():
        paths[name] = directory / f"{name}.vec"
        steps = [[_tokens(rng, 1), _tokens(rng, 1)], [_tokens(rng, 3), []]]
        write_vectors(paths[name], engine, [_tokens(rng, 37), _tokens(rng, 20)], steps)
    return paths


@pytest.mark.parametrize("variant", ["int8", "int8-planes2", "q4", "qwen2-bias"])
@pytest.mark.parametrize("build", list(BUILDS))
def test_the_forward_equals_the_torch_statement(
        harness: Callable[..., str], vectors: dict[str, Path], build: str, variant: str) -> None:
    output = harness(build, vectors[variant], "forward")
    assert output.count("elements differ") == 2 * 3 * 3  # threads x calls x (logits, pool)
    assert output.rstrip().endswith("harness: all equal")


@pytest.mark.parametrize("build", list(BUILDS))
def test_the_tables_equal_the_numpy_statement(
        harness: Callable[..., str], vectors: dict[str, Path], build: str) -> None:
    output = harness(build, vectors["int8"], "tables")
    assert output.count("elements differ") == 2 * 4 * 3  # threads x cases x arrays
    assert output.rstrip().endswith("harness: all equal")


@pytest.mark.parametrize("part, array", [("tables", "tables0.cumulative"),
                                         ("forward", "call2.logits")])
def test_a_corrupted_expected_byte_is_reported(
        harness: Callable[..., str], vectors: dict[str, Path], tmp_path: Path, part: str,
        array: str) -> None:
    """The harness is no tautology: one expected byte changed is one mismatch, and exit 1
    (under qemu, on the plain-C build; a later call's logits, so the forward runs whole)."""
    corrupted = tmp_path / "corrupted.vec"
    data = bytearray(vectors["int8"].read_bytes())
    offset, size = array_spans(vectors["int8"])[array]
    data[offset + size // 2] ^= 0x10
    corrupted.write_bytes(bytes(data))
    output = harness("aarch64-scalar", corrupted, part, expect=1)
    label = array.replace(".", " ")
    mismatches = [line for line in output.splitlines()
                  if "elements differ" in line and ": 0 of " not in line]
    assert [line.split()[0:2] for line in mismatches] == [label.split()] * 2, output
    assert all(": 1 of " in line for line in mismatches), output
    assert output.rstrip().endswith("harness: MISMATCH")


@pytest.mark.parametrize("tool", [CROSS, QEMU])
def test_a_missing_cross_tool_fails_naming_the_install_script(
        tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=r"scripts/cross\.sh install"):
        require_tool(tool)

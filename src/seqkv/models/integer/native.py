"""The integer forward's CPU path in C (``native.c``), built with the system C compiler.

``forward.py`` states the integer predictor with torch operators, and that statement is the
reference. A one-row decoding step runs about 18,000 of those operators, and their dispatch, not
the arithmetic, is most of the step. ``native.c`` computes the same integers: ``seqkv_layers``
runs every decoder layer in one call (RMSNorm and quantization, the linear layers on packed
weights, RoPE, attention, SiLU, the KV pool writes), ``seqkv_head`` the final norm and output
layer, and ``seqkv_integer_tables`` the coder tables (the same operations as ``table.py``); a
layer of the 4-bit predictor runs on its Q4_1 blocks as ``pack_blocks`` lays them out.
``tests/test_integer_native.py`` asserts the two paths' logits, KV planes and tables equal bit
for bit over chunkings, batches, thread counts and weight planes, on a tiny model and on the
embedded one, on every instruction set this CPU runs.

Instruction sets (``ISAS``): one library per path, each built with its own flags (never
``-march=native``), so a forced path is not silently vectorized with another's instructions:
``scalar`` (plain C99 for the base of the architecture), ``avx2`` (AVX2 and F16C),
``avxvnni`` (AVX2 with the 256-bit AVX-VNNI), ``avx512vnni`` (AVX-512 F/BW/DQ/VL with VNNI)
and ``neon`` (ARMv8.2 with the dot product). ``auto`` takes the best path that this CPU
reports and the compiler builds; ``$SEQKV_INTEGER_ISA`` forces one, and a name that is unknown or
that this CPU lacks is refused (``IntegerBackendError``). ``$SEQKV_INTEGER_BACKEND`` chooses the
engine: ``auto`` (native where it builds, else the torch statement), ``native`` (native or an
error) or ``torch`` (the reference; ``$SEQKV_INTEGER_ISA`` must then be unset, since it would
have no effect). Every path computes the same integers (integer arithmetic without undefined
behaviour: ``-fwrapv``, shifts clamped; the tables' float64 operations each correctly rounded,
no contraction, sums in one fixed order), so the choice changes speed only.

NOTE: why C through ``ctypes`` and not a torch C++ extension or Triton: the functions need no
torch API (they read and write contiguous integer arrays), a torch extension costs a minute of
compilation against torch's headers and a ``ninja`` install, and Triton runs on a CPU only in
its interpreter.

Build: on first use, into ``$SEQKV_NATIVE_DIR`` (default ``$XDG_CACHE_HOME/seqkv/native`` or
``~/.cache/seqkv/native``), as a file named by the SHA-256 of the source, the compiler command
and the target architecture; written to a temporary name and renamed, so concurrent builds
cannot load half a file. The cache is a cache: before ``ctypes`` maps a library into this
process, a child process loads it and asks it its instruction set, so a truncated, foreign or
damaged file (which could kill the process that maps it) is found there; it is then built again,
and only a second failure is an error (``native``) or the torch path (``auto``). Threads:
OpenMP, sharing independent output blocks and rows, so the split cannot change a result.

Invariants:
1. Every function here computes exactly what the torch or numpy code it replaces computes, on
   every path (asserted by the tests on the paths this CPU runs, not provable here).
2. Callers pass C-contiguous CPU tensors and arrays of the dtypes each C signature states
   (enforced by construction in ``forward.py`` and ``table.py``, which allocate them; not
   checked per call, see ``NativeKernels.call``).
3. A library is loaded once per process and never rebuilt while loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt
import torch

from seqkv.errors import IntegerBackendError

_LOG = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("native.c")
# NOTE: -fwrapv defines signed overflow as two's complement wrap-around, as torch's int64
# arithmetic has it: the stated bounds keep every value in range, and should a value ever leave
# it, both paths still compute the same integers.
# -ffp-contract=off: no fused multiply-add in the coder tables' float64 operations (ISO C
# modes default to it; stated so that no compiler's default can differ).
_FLAGS = ("-O3", "-std=c99", "-fwrapv", "-ffp-contract=off", "-shared", "-fPIC")
_LIBRARIES = ("-lm",)
# NOTE: OpenMP shares a linear layer's output blocks between torch's intra-op threads (torch's
# own libgomp serves it: the library is loaded after torch); a compiler without it builds the
# single-threaded library.
_OPENMP = ("-fopenmp",)
BACKEND_ENV = "SEQKV_INTEGER_BACKEND"
ISA_ENV = "SEQKV_INTEGER_ISA"

Backend = Literal["auto", "native", "torch"]
Isa = Literal["scalar", "avx2", "avxvnni", "avx512vnni", "neon"]
ISAS: tuple[Isa, ...] = get_args(Isa)  # in native.c's seqkv_isa() order
_BACKENDS: tuple[Backend, ...] = get_args(Backend)
_X86_BASE = ("-march=x86-64",)
_AVX2 = (*_X86_BASE, "-mavx2", "-mf16c", "-mfma", "-mbmi2")
# Per path: the compiler flags, and the CPU flags (Linux /proc/cpuinfo names) it needs.
_X86_PATHS: dict[Isa, tuple[tuple[str, ...], frozenset[str]]] = {
    "avx512vnni": ((*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl",
                    "-mavx512vnni"),
                   frozenset({"avx2", "f16c", "fma", "bmi2", "avx512f", "avx512bw", "avx512dq",
                              "avx512vl", "avx512_vnni"})),
    "avxvnni": ((*_AVX2, "-mavxvnni"), frozenset({"avx2", "f16c", "fma", "bmi2", "avx_vnni"})),
    "avx2": (_AVX2, frozenset({"avx2", "f16c", "fma", "bmi2"})),
    "scalar": (_X86_BASE, frozenset()),
}
_ARM_PATHS: dict[Isa, tuple[tuple[str, ...], frozenset[str]]] = {
    "neon": (("-march=armv8.2-a+dotprod",), frozenset({"asimddp"})),
    "scalar": (("-march=armv8-a",), frozenset()),
}
_PROBE = ("import ctypes, sys\n"
          "library = ctypes.CDLL(sys.argv[1])\n"
          "library.seqkv_isa.restype = ctypes.c_int64\n"
          "for name in ('seqkv_layers', 'seqkv_head', 'seqkv_integer_tables'):\n"
          "    getattr(library, name)\n"
          "print(library.seqkv_isa())\n")

_P = ctypes.c_void_p
_I = ctypes.c_int64
_SIGNATURES: dict[str, tuple[type, ...]] = {
    # layer descriptions, layer count, hidden, rows, positions, spans, span count, threads
    "seqkv_layers": (_P, _I, _P, _I, _P, _P, _I, _I),
    # layer description, head, hidden, rows, out_frac, logits, threads
    "seqkv_head": (_P, _P, _P, _I, _I, _P, _I),
    "seqkv_integer_tables": (_P, _I, _I, _I, _I, _I, _I, _P, _P, _I, _P, _P, _P, _P, _I),
}


def _machine() -> str:
    return platform.machine().lower()


def _paths() -> dict[Isa, tuple[tuple[str, ...], frozenset[str]]]:
    """This architecture's paths, best first; elsewhere plain C with the compiler's defaults."""
    machine = _machine()
    if machine in ("x86_64", "amd64"):
        return _X86_PATHS
    if machine in ("aarch64", "arm64"):
        return _ARM_PATHS
    return {"scalar": ((), frozenset())}


def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux names them (``flags`` or ``Features`` of
    /proc/cpuinfo); on macOS the one this module asks for (the Arm dot product)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    if sys.platform == "darwin" and _machine() == "arm64":
        try:
            answer = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_DotProd"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            answer = ""
        return frozenset({"asimddp"}) if answer == "1" else frozenset()
    return frozenset()


def cpu_isas() -> tuple[Isa, ...]:
    """The paths this CPU can run, best first (``scalar`` always)."""
    flags = _cpu_flags()
    return tuple(isa for isa, (_, needs) in _paths().items() if needs <= flags)


def _choices() -> tuple[Backend, Isa | None]:
    """The environment's backend and forced path, each checked (``IntegerBackendError``)."""
    backend = os.environ.get(BACKEND_ENV, "auto") or "auto"
    if backend not in _BACKENDS:
        raise IntegerBackendError(f"{BACKEND_ENV}={backend!r}: must be auto, native or torch")
    isa = os.environ.get(ISA_ENV, "") or None
    if isa is None:
        return backend, None
    if isa not in ISAS:
        raise IntegerBackendError(f"{ISA_ENV}={isa!r}: must be one of {', '.join(ISAS)}")
    if backend == "torch":
        raise IntegerBackendError(f"{ISA_ENV}={isa} has no effect with {BACKEND_ENV}=torch: "
                                  "unset one of them")
    if isa not in cpu_isas():
        raise IntegerBackendError(
            f"{ISA_ENV}={isa}: this CPU ({_machine()}) cannot run it; it runs "
            f"{', '.join(cpu_isas())}")
    return backend, isa


def _cache_dir() -> Path:
    explicit = os.environ.get("SEQKV_NATIVE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "seqkv" / "native"


def _build(isa: Isa) -> Path:
    """The library of path ``isa``, with OpenMP where the compiler has it."""
    compiler = shlex.split(os.environ.get("CC", "cc"))
    flags = (*_FLAGS, *_paths()[isa][0])
    try:
        return _compiled(compiler, (*flags, *_OPENMP), isa)
    except subprocess.CalledProcessError:
        return _compiled(compiler, flags, isa)


def _compiled(compiler: list[str], flags: tuple[str, ...], isa: Isa | None = None) -> Path:
    """The library ``compiler flags native.c`` builds, from the cache or built now; with ``isa``,
    checked in a child process to load and to be that path (a failed check removes the file
    and builds it once more)."""
    text = _SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([text, " ".join(compiler + list(flags)).encode(),
                                     _machine().encode()]))
    directory = _cache_dir()
    target = directory / f"seqkv_integer_{key.hexdigest()[:24]}.so"
    for attempt in range(2):
        if not target.exists():
            directory.mkdir(parents=True, exist_ok=True)
            handle, partial = tempfile.mkstemp(suffix=".so", dir=directory)
            os.close(handle)
            try:
                subprocess.run([*compiler, *flags, "-o", partial, str(_SOURCE), *_LIBRARIES],
                               check=True, capture_output=True, text=True, timeout=300)
                os.replace(partial, target)
            finally:
                if os.path.exists(partial):
                    os.unlink(partial)
        if isa is None:
            return target
        problem = _probe(target, isa)
        if problem is None:
            return target
        _LOG.warning("native library %s failed its check (%s); %s", target, problem,
                     "building it again" if attempt == 0 else "giving up")
        target.unlink(missing_ok=True)
    raise OSError(f"native.c's {isa} library fails its check after a fresh build: {problem}")


def _probe(library: Path, isa: Isa) -> str | None:
    """None when a child process loads ``library`` and it reports path ``isa``; else what
    went wrong. A file that is not a regular file of a plausible size is refused unopened."""
    try:
        size = library.lstat().st_size if library.is_file() and not library.is_symlink() else -1
    except OSError as error:
        return str(error)
    if size < 1024:
        return "not a regular file of a shared library's size"
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, str(library)], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return str(error)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"exit status {done.returncode}" + (f": {lines[-1]}" if lines else "")
    if done.stdout.strip() != str(ISAS.index(isa)):
        return f"reports instruction set {done.stdout.strip()!r}, not {ISAS.index(isa)} ({isa})"
    return None


class NativeKernels:
    """The loaded library, one typed function per fused path."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions: dict[str, Any] = {}
        for name, arguments in _SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes = list(arguments)
            function.restype = ctypes.c_int64
            self._functions[name] = function
        library.seqkv_isa.restype = ctypes.c_int64
        self.isa: Isa = ISAS[int(library.seqkv_isa())]

    def call(self, name: str,
             *arguments: int | torch.Tensor | npt.NDArray[Any] | ctypes.Structure
             | ctypes.Array[Any] | None) -> int:
        """Call ``name`` with tensors and arrays passed as their data pointers, ctypes
        structures by address, None as NULL and ints as int64; return its status (0, or -2 for a
        function-specific refusal). The caller passes C-contiguous CPU tensors and arrays of the
        dtypes the C signature states (the callers allocate them so; not checked per call: a
        check per tensor would cost more than many of the calls)."""
        status = int(self._functions[name](*[
            argument.data_ptr() if isinstance(argument, torch.Tensor)
            else argument.ctypes.data if isinstance(argument, np.ndarray)
            else ctypes.addressof(argument) if isinstance(argument, ctypes.Structure | ctypes.Array)
            else argument
            for argument in arguments]))
        if status == -1:
            raise MemoryError(f"native.c's {name} could not allocate its working memory")
        return status


LANES = 16  # native.c: output rows per packed block


class LinearStruct(ctypes.Structure):
    """native.c's ``seqkv_linear_t``: a linear layer on packed weights."""

    _fields_ = [("packed", _P), ("sums", _P), ("scale", _P), ("bias", _P),
                ("scale_bits", _I), ("planes", _I), ("n_out", _I), ("k", _I), ("kind", _I)]


class LayerStruct(ctypes.Structure):
    """native.c's ``seqkv_layer_t``: one decoder layer's weights, tables and constants."""

    _fields_ = [("qkv", LinearStruct), ("o", LinearStruct), ("gate", LinearStruct),
                ("up", LinearStruct), ("down", LinearStruct), ("rsqrt", _P), ("sigmoid", _P),
                ("softmax", _P), ("cos", _P), ("sin", _P), ("softmax_size", _I),
                ("eps_term", _I), ("heads", _I), ("kv_heads", _I), ("head_dim", _I),
                ("score_scale", _I), ("score_shift", _I), ("qkv_frac", _I),
                ("hidden_frac", _I), ("gate_frac", _I), ("mantissa_bits", _I),
                ("attention_offset", _I), ("mlp_offset", _I), ("attention_gain", _P),
                ("mlp_gain", _P), ("attention_gain_frac", _I), ("mlp_gain_frac", _I)]


class SpanStruct(ctypes.Structure):
    """native.c's ``seqkv_span_t``: rows of one sequence and its slot in its pool."""

    _fields_ = [("start", _I), ("count", _I), ("position", _I), ("planes", _P),
                ("shifts", _P), ("plane_layer_stride", _I), ("plane_kv_stride", _I),
                ("shift_layer_stride", _I), ("shift_kv_stride", _I)]


def pack_weight(weight: torch.Tensor, planes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """native.c's packed layout (``seqkv_linear_packed``) of an int8 weight ``[planes * N, K]``
    (``K`` a multiple of 4) and its row sums (int32), rows padded with zeros to a multiple of 16
    per plane."""
    rows, k = weight.shape
    n = rows // planes
    blocks = -(-n // LANES)
    padded = weight.new_zeros((planes, blocks * LANES, k))
    padded[:, :n] = weight.view(planes, n, k)
    packed = padded.view(planes, blocks, LANES, k // 4, 4).permute(0, 1, 3, 2, 4).contiguous()
    return packed, padded.sum(-1, dtype=torch.int32).contiguous()


LINEAR_INT8, LINEAR_Q4 = 0, 1  # seqkv_linear_t.kind
Q4_BLOCK = 32  # native.c: weights per Q4_1 block


def pack_blocks(quants: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """native.c's Q4_1 layout (``seqkv_linear_q4``) of nibbles ``quants [N, K]`` (int8, 0..15)
    and float16 ``d``, ``m`` ``[N, K // 32]``: uint8 ``[groups, K // 32, 320]``, rows padded with
    zeros to a multiple of 16. Per group of 16 rows and block: byte ``64 j + 4 l + i`` holds
    weight ``4 j + i`` of row ``l`` in its low nibble and weight ``16 + 4 j + i`` in its high
    one; then the 16 rows' ``d``, then their ``m`` (fp16 bits, little-endian)."""
    n, k = quants.shape
    blocks = k // Q4_BLOCK
    groups = -(-n // LANES)
    padded = quants.new_zeros((groups * LANES, k)).to(torch.uint8)
    padded[:n] = quants.to(torch.uint8)
    # [groups, lanes, blocks, 2 (low, high), 16 (4 j + i)]
    halves = padded.view(groups, LANES, blocks, 2, Q4_BLOCK // 2)
    nibbles = halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)  # [groups, lanes, blocks, 16]
    # [groups, blocks, 4 (j), lanes, 4 (i)]
    nibbles = nibbles.view(groups, LANES, blocks, 4, 4).permute(0, 2, 3, 1, 4)
    meta = torch.zeros((2, groups * LANES, blocks), dtype=torch.float16)
    meta[0, :n], meta[1, :n] = d, m
    # [2, groups, lanes, blocks] -> [groups, blocks, 2, lanes] as bytes
    meta_bytes = meta.view(2, groups, LANES, blocks).permute(1, 3, 0, 2).contiguous()
    return torch.cat([nibbles.reshape(groups, blocks, 256),
                      meta_bytes.view(torch.uint8).reshape(groups, blocks, 64)], dim=2
                     ).contiguous()


@dataclass(frozen=True, slots=True)
class NativeStatus:
    """Where the integer forward runs in this process (``seqkv doctor``)."""

    backend: Backend  # $SEQKV_INTEGER_BACKEND
    forced: Isa | None  # $SEQKV_INTEGER_ISA
    cpu: tuple[Isa, ...]  # the paths this CPU runs, best first
    isa: Isa | None  # the path loaded, or None: the torch statement runs
    reason: str  # why that path


@cache
def load() -> NativeKernels | None:
    """The native kernels of the chosen path (see the module docstring), or None (the torch
    statement) when disabled or not buildable. ``IntegerBackendError`` for a bad choice."""
    backend, forced = _choices()
    if backend == "torch":
        return None
    candidates = (forced,) if forced is not None else cpu_isas()
    failures: list[str] = []
    for isa in candidates:
        try:
            return kernels(isa)
        except (OSError, subprocess.SubprocessError) as error:
            detail = getattr(error, "stderr", "") or str(error)
            lines = [line for line in detail.splitlines() if "error" in line] or [str(error)]
            failures.append(f"{isa}: {lines[0].strip()}")
    if backend == "native" or forced is not None:
        raise RuntimeError(f"native.c did not build ({'; '.join(failures)}), and "
                           f"{BACKEND_ENV}={backend}" + (f", {ISA_ENV}={forced}" if forced else ""))
    _LOG.warning("the integer forward runs its torch path: native.c did not build (%s)",
                 failures[0] if failures else "no path")
    return None


@cache
def kernels(isa: Isa) -> NativeKernels:
    """The library of path ``isa`` (built and checked on first use; ``IntegerBackendError`` when
    this CPU cannot run it; ``OSError`` or ``subprocess.SubprocessError`` when it does not
    build), whatever the environment chooses: how tests and benchmarks run each path in one
    process."""
    if isa not in ISAS:
        raise IntegerBackendError(f"unknown instruction set {isa!r}: one of {', '.join(ISAS)}")
    if isa not in cpu_isas():
        raise IntegerBackendError(f"this CPU ({_machine()}) cannot run the {isa} path; it runs "
                                  f"{', '.join(cpu_isas())}")
    return NativeKernels(ctypes.CDLL(str(_build(isa))))


def status() -> NativeStatus:
    """The choice ``load`` makes here, and why (builds the library if needed)."""
    backend, forced = _choices()
    cpu = cpu_isas()
    kernels = load()
    if kernels is None:
        reason = (f"{BACKEND_ENV}=torch" if backend == "torch"
                  else "native.c did not build: the torch statement runs")
    elif forced is not None:
        reason = f"forced by {ISA_ENV}"
    else:
        reason = "the best path this CPU runs" + (
            "" if kernels.isa == cpu[0] else f" and the compiler builds ({cpu[0]} did not)")
    return NativeStatus(backend, forced, cpu, None if kernels is None else kernels.isa, reason)

"""The integer forward's CPU path in C (``native.c``), built with the system C compiler.

``forward.py`` states the integer predictor with torch operators, and that statement is the
reference. A one-row decoding step runs about 18,000 of those operators; measured on this
project's CPU (SmolLM2-135M, one thread, 128 tokens of context), the int8 products took 25 ms of
a 69 ms step and operator dispatch most of the rest. ``native.c`` computes the same integers:
``seqkv_layers`` runs every decoder layer in one call (RMSNorm and quantization, the linear
layers on weights packed for AVX-512 VNNI, RoPE, attention, SiLU, the KV pool writes),
``seqkv_head`` the final norm and output layer, and ``seqkv_integer_tables`` the coder tables
(a layer of the 4-bit predictor runs on its Q4_1 blocks as ``pack_blocks`` lays them out,
``seqkv_linear_q4``)
(the same operations as ``table.py``). A build without VNNI (``NativeKernels.packed`` false)
serves the tables only; the forward then runs its torch statement.
``tests/test_integer_native.py`` asserts the two paths' logits, KV planes and tables equal bit
for bit over chunkings, batches, thread counts and weight planes, on a tiny model and on the
embedded one.

NOTE: why C through ``ctypes`` and not a torch C++ extension or Triton: the functions need no
torch API (they read and write contiguous integer arrays), a torch extension costs a minute of
compilation against torch's headers and a ``ninja`` install, and Triton runs on this CPU only in
its interpreter. ``cc`` builds ``native.c`` in about 2 seconds (1.7 s measured, -O3).

Build: on first use, into ``$SEQKV_NATIVE_DIR`` (default ``$XDG_CACHE_HOME/seqkv/native`` or
``~/.cache/seqkv/native``), as a file named by the SHA-256 of the source, the compiler command
and this CPU's flags (so a cache shared between machines never loads a library built for
another CPU); written to a temporary name and renamed, so concurrent builds cannot load half a
file. ``-march=native`` only chooses instructions: the forward is integer arithmetic without
undefined behaviour (``-fwrapv``, shifts clamped) and the tables' float64 operations are each
correctly rounded (no contraction), so the instructions cannot change a result. Threads:
OpenMP, sharing independent output blocks and rows, so the split cannot change a result either.

Fallback: where no compiler works, or ``SEQKV_INTEGER_BACKEND=torch`` is set, ``load()`` returns
None and the forward and the tables run their torch and numpy statements (the same bits,
slower); a build failure is logged once with the compiler's error.

Invariants:
1. Every function here computes exactly what the torch or numpy code it replaces computes
   (asserted by the tests, not provable here).
2. Callers pass C-contiguous CPU tensors and arrays of the dtypes each C signature states
   (enforced by construction in ``forward.py`` and ``table.py``, which allocate them; not
   checked per call, see ``NativeKernels.call``).
3. The library is loaded once per process and never rebuilt while loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

_LOG = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("native.c")
# NOTE: -fwrapv defines signed overflow as two's complement wrap-around, as torch's int64
# arithmetic has it: the stated bounds keep every value in range, and should a value ever leave
# it, both paths still compute the same integers.
# -ffp-contract=off: no fused multiply-add in the coder tables' float64 operations (ISO C
# modes default to it; stated so that no compiler's default can differ).
_FLAGS = ("-O3", "-march=native", "-std=c99", "-fwrapv", "-ffp-contract=off", "-shared",
          "-fPIC")
_LIBRARIES = ("-lm",)
# NOTE: OpenMP shares a linear layer's output blocks between torch's intra-op threads (torch's
# own libgomp serves it: the library is loaded after torch); a compiler without it builds the
# single-threaded library.
_OPENMP = ("-fopenmp",)
BACKEND_ENV = "SEQKV_INTEGER_BACKEND"

_P = ctypes.c_void_p
_I = ctypes.c_int64
_SIGNATURES: dict[str, tuple[type, ...]] = {
    # layer descriptions, layer count, hidden, rows, positions, spans, span count, threads
    "seqkv_layers": (_P, _I, _P, _I, _P, _P, _I, _I),
    # layer description, head, hidden, rows, out_frac, logits, threads
    "seqkv_head": (_P, _P, _P, _I, _I, _P, _I),
    "seqkv_integer_tables": (_P, _I, _I, _I, _I, _I, _I, _P, _P, _I, _P, _P, _P, _P, _I),
}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _cache_dir() -> Path:
    explicit = os.environ.get("SEQKV_NATIVE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "seqkv" / "native"


def _build() -> Path:
    compiler = shlex.split(os.environ.get("CC", "cc"))
    try:
        return _compiled(compiler, (*_FLAGS, *_OPENMP))
    except subprocess.CalledProcessError:
        return _compiled(compiler, _FLAGS)


def _compiled(compiler: list[str], flags: tuple[str, ...]) -> Path:
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(compiler + list(flags)).encode(),
                                     _cpu_flags().encode(), platform.machine().encode()]))
    directory = _cache_dir()
    target = directory / f"seqkv_integer_{key.hexdigest()[:24]}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(handle)
    try:
        subprocess.run([*compiler, *flags, "-o", partial, str(_SOURCE), *_LIBRARIES], check=True,
                       capture_output=True, text=True, timeout=300)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


class NativeKernels:
    """The loaded library, one typed function per fused path."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions: dict[str, Any] = {}
        for name, arguments in _SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes = list(arguments)
            function.restype = ctypes.c_int64
            self._functions[name] = function
        library.seqkv_has_packed.restype = ctypes.c_int64
        self.packed = bool(library.seqkv_has_packed())
    def call(self, name: str,
             *arguments: int | torch.Tensor | npt.NDArray[Any] | ctypes.Structure
             | ctypes.Array[Any] | None) -> int:
        """Call ``name`` with tensors and arrays passed as their data pointers, ctypes
        structures by address, None as NULL and ints as int64; return its status (0, or -2 for a
        function-specific refusal). The caller passes C-contiguous CPU tensors and arrays of the
        dtypes the C signature states (the callers allocate them so; not checked per call: a check
        costs ~1 us a tensor)."""
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


@cache
def load() -> NativeKernels | None:
    """The native kernels, or None (torch fallback) when disabled or not buildable."""
    choice = os.environ.get(BACKEND_ENV, "auto")
    if choice == "torch":
        return None
    if choice not in ("auto", "native"):
        raise ValueError(f"{BACKEND_ENV} must be auto, native or torch, not {choice!r}")
    try:
        return NativeKernels(ctypes.CDLL(str(_build())))
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        if choice == "native":
            raise RuntimeError(f"{BACKEND_ENV}=native, but native.c did not build: "
                               f"{detail}") from error
        errors = [line for line in detail.splitlines() if "error" in line] or [str(error)]
        _LOG.warning("the integer forward runs its torch path: native.c did not build (%s)",
                     errors[0].strip())
        return None

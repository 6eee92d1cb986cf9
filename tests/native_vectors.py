"""Test vectors for ``tests/native/harness.c``: native.c's inputs and the torch statement's outputs.

``tests/native/harness.c`` includes ``native.c`` and runs its exported functions without Python
(so it can be cross-compiled and run under an emulator, ``tests/test_native_aarch64.py``). It
reads one vector file written here and compares what native.c computes with what
``IntegerForward(backend="torch")`` and ``table.numpy_tables`` computed.

The file is a sequence of named arrays, little-endian, until its end::

    magic  b"SEQKVVEC"
    then per array:
      u32 name length, name (ASCII)
      4 bytes dtype: numpy kind and item size, NUL-padded (b"i1\\0\\0", b"u1", b"i4", b"i8", b"f8")
      u32 ndim, then ndim i64 dims
      the elements (C order)

Contents (``{i}`` a layer, ``{c}`` a forward call, ``{t}`` a table case; a NULL pointer of
native.c's structs is an absent array):

* ``layer{i}.{field}``, ``layer{i}.{linear}.{field}`` and ``head.{field}``: every field of
  native.py's ``LayerStruct``/``LinearStruct`` as ``forward.IntegerForward._layer_struct`` and
  ``_linear_struct`` fill them (scalars as 0-d int64; pointers as the arrays they point to,
  checked here to be exactly those arrays); ``head.out_frac``; ``layers`` (their count);
* ``pool.planes``, ``pool.shifts``: the KV pool before the first call (zeros);
* ``call{c}.hidden``, ``call{c}.positions``: ``seqkv_layers``' inputs; ``call{c}.spans``: int64
  ``[spans, 9]``, the fields of ``SpanStruct`` with ``planes`` and ``shifts`` as byte offsets
  into the pool's arrays (``forward._native_spans``' own values); ``call{c}.logits``,
  ``call{c}.pool.planes``, ``call{c}.pool.shifts``: the torch path's logits and pool after it;
* ``tables.{fine_high, fine_low, log2e_fixed, gap_shift, max_gap, total_frequency}`` and per
  case ``tables{t}.logits`` (input), ``.top_bits``, ``.cumulative``, ``.log2p`` (``top_bits -
  z * 2**-20``, before ``table.py`` subtracts ``log2(S)``), ``.totals``, ``.weighted_gaps``
  (numpy's summation order: equal to native.c's to rounding only, see table.py).

Invariant (checked here): every pointer a struct holds is the address of the array written
under its name, and that array is C-contiguous; so the harness's structs describe the same
memory ``forward.py`` hands native.c.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
import torch

from seqkv.coding.frequencies import TOTAL_FREQUENCY
from seqkv.models.integer import IntegerForward, native, table
from seqkv.models.integer.blocks import BlockLayer, BlockLinear
from seqkv.models.integer.fixedpoint import FINE_FRAC_BITS, fine_tables
from seqkv.models.integer.forward import LOGIT_FRAC, IntSequence
from seqkv.models.integer.weights import HIDDEN_FRAC, IntLinear

MAGIC = b"SEQKVVEC"
_LINEARS = ("qkv", "o", "gate", "up", "down")

Array = npt.NDArray[np.generic]


class VectorWriter:
    """Named arrays into one vector file (the format in the module docstring)."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._names: set[str] = set()
        handle.write(MAGIC)

    def array(self, name: str, values: Array | torch.Tensor | int) -> None:
        if name in self._names:
            raise ValueError(f"{name} written twice")
        self._names.add(name)
        if isinstance(values, torch.Tensor):
            if not values.is_contiguous():
                raise ValueError(f"{name}: native.c reads C-contiguous arrays only")
            values = values.cpu().numpy()
        data = (np.asarray(values, dtype=np.int64) if isinstance(values, int)
                else np.ascontiguousarray(values))
        code = f"{data.dtype.kind}{data.dtype.itemsize}".encode()
        if code not in (b"i1", b"u1", b"i4", b"i8", b"f8"):
            raise ValueError(f"{name}: the harness reads no {data.dtype}")
        encoded = name.encode("ascii")
        self._handle.write(struct.pack("<I", len(encoded)) + encoded + code.ljust(4, b"\0"))
        self._handle.write(struct.pack(f"<I{data.ndim}q", data.ndim, *data.shape))
        self._handle.write(data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes())


def array_spans(path: Path) -> dict[str, tuple[int, int]]:
    """Each array's name to the byte offset and length of its elements in a vector file (for
    tests that corrupt one expected value)."""
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        raise ValueError(f"{path} is not a vector file")
    spans: dict[str, tuple[int, int]] = {}
    at = len(MAGIC)
    while at < len(data):
        (length,) = struct.unpack_from("<I", data, at)
        name = data[at + 4 : at + 4 + length].decode("ascii")
        code = data[at + 4 + length : at + 6 + length].decode("ascii")
        at += 8 + length
        (ndim,) = struct.unpack_from("<I", data, at)
        shape = struct.unpack_from(f"<{ndim}q", data, at + 4)
        at += 4 + 8 * ndim
        size = int(np.prod(shape, dtype=np.int64)) * int(code[1])
        spans[name] = (at, size)
        at += size
    return spans


def _is(pointer: int | None, values: torch.Tensor | None) -> bool:
    """Whether a struct's pointer field holds exactly ``values``' address (None: NULL)."""
    if values is None:
        return pointer is None
    return pointer == values.data_ptr() and values.is_contiguous()


def _write_struct(out: VectorWriter, prefix: str, entry: ctypes.Structure,
                  pointers: dict[str, torch.Tensor | None]) -> None:
    """Every field of ``entry``: int64 fields as scalars, pointer fields as ``pointers[name]``
    (asserted to be what the struct points to), nested structs under their own prefix."""
    for name, kind in entry._fields_:  # type: ignore[misc]
        value = getattr(entry, name)
        if isinstance(value, ctypes.Structure):
            continue  # the caller writes nested linear layers with their own tensors
        if kind is ctypes.c_int64:
            out.array(f"{prefix}.{name}", int(value))
            continue
        tensor = pointers[name]
        assert _is(value, tensor), f"{prefix}.{name} is not the array forward.py passes"
        if tensor is not None:
            out.array(f"{prefix}.{name}", tensor)


def _write_linear(out: VectorWriter, prefix: str, engine: IntegerForward,
                  linear: IntLinear | BlockLinear, entry: native.LinearStruct) -> None:
    if isinstance(linear, BlockLinear):
        pointers = {"packed": engine._packed_blocks(linear), "sums": None, "scale": None,
                    "bias": linear.bias}
    else:
        packed, sums = engine._packed_weight(linear)
        pointers = {"packed": packed, "sums": sums, "scale": linear.scale, "bias": linear.bias}
    _write_struct(out, prefix, entry, pointers)


def _write_model(out: VectorWriter, engine: IntegerForward) -> None:
    tables = engine._tables
    out.array("layers", engine.num_layers)
    for index, layer in enumerate(engine._layers):
        entry = engine._layer_struct(index)  # forward.py's own description of the layer
        gate, up = engine._gate_up[index]
        for name, linear in zip(_LINEARS, (layer.qkv, layer.o, gate, up, layer.down),
                                strict=True):
            _write_linear(out, f"layer{index}.{name}", engine, linear, getattr(entry, name))
        gains = ((layer.attention_gain.values, layer.mlp_gain.values)
                 if isinstance(layer, BlockLayer) else (None, None))
        # the tables are the same tensors in every layer: written under each layer's name
        _write_struct(out, f"layer{index}", entry, {
            "rsqrt": tables.rsqrt, "sigmoid": tables.sigmoid, "softmax": tables.softmax,
            "cos": engine._cos, "sin": engine._sin, "attention_gain": gains[0],
            "mlp_gain": gains[1]})
    head = engine.weights.head
    _write_linear(out, "head", engine, head, engine._linear_struct(head))
    out.array("head.out_frac", LOGIT_FRAC)


def _write_call(out: VectorWriter, prefix: str, engine: IntegerForward,
                calls: Sequence[tuple[IntSequence, Sequence[int]]]) -> npt.NDArray[np.int64]:
    """One forward: native.c's inputs as ``forward.py`` builds them, then the torch path's
    logits and pool. Returns the logits."""
    spans, ids, positions = engine._plan(calls)  # grows the pool; lengths move in forward()
    pool = calls[0][0].pool
    assert all(sequence.pool is pool for sequence, _ in calls)
    rows = []
    for entry in engine._native_spans(spans):  # forward.py's own span descriptions
        rows.append([entry.start, entry.count, entry.position,
                     entry.planes - pool.planes.data_ptr(), entry.shifts - pool.shifts.data_ptr(),
                     entry.plane_layer_stride, entry.plane_kv_stride, entry.shift_layer_stride,
                     entry.shift_kv_stride])
    token_ids = torch.tensor(ids, dtype=torch.long)
    # forward.py's residual stream entering the layers
    hidden = engine.weights.embedding[token_ids].to(torch.int64) << (
        HIDDEN_FRAC - engine.weights.embedding_frac)  # [rows, hidden]
    out.array(f"{prefix}.hidden", hidden)
    out.array(f"{prefix}.positions", np.asarray(positions, dtype=np.int64))
    out.array(f"{prefix}.spans", np.asarray(rows, dtype=np.int64))
    capacity = pool.capacity
    logits = np.concatenate(engine.forward(calls))  # [rows, vocab], the calls' rows in order
    assert pool.capacity == capacity, "the harness keeps one pool: give it room for all calls"
    out.array(f"{prefix}.logits", logits)
    out.array(f"{prefix}.pool.planes", pool.planes)
    out.array(f"{prefix}.pool.shifts", pool.shifts)
    return logits


def _write_tables(out: VectorWriter, cases: Sequence[npt.NDArray[np.int64]]) -> None:
    high, low = fine_tables()
    out.array("tables.fine_high", high)
    out.array("tables.fine_low", low)
    out.array("tables.log2e_fixed", table.LOG2E_FIXED)
    out.array("tables.gap_shift", table._GAP_SHIFT)
    out.array("tables.max_gap", table._MAX_GAP)
    out.array("tables.total_frequency", TOTAL_FREQUENCY)
    out.array("tables.cases", len(cases))
    for index, logits in enumerate(cases):
        rows = np.ascontiguousarray(logits, dtype=np.int64)
        z, weights, top_bits = table._weights(rows)
        prefix = f"tables{index}"
        out.array(f"{prefix}.logits", rows)
        out.array(f"{prefix}.top_bits", top_bits)
        out.array(f"{prefix}.cumulative", table.numpy_tables(rows).cumulative)
        # numpy_tables' log2p before its "- log2_total", the part native.c computes
        out.array(f"{prefix}.log2p", np.asarray(top_bits - z * 2.0**-FINE_FRAC_BITS,
                                                dtype=np.float64))
        out.array(f"{prefix}.totals", weights.sum(axis=-1, keepdims=True))
        out.array(f"{prefix}.weighted_gaps", (weights.astype(np.float64)
                                              * z.astype(np.float64)).sum(-1, keepdims=True))


def synthetic_logits(seed: int = 7) -> npt.NDArray[np.int64]:
    """Table rows the tiny model does not make: a vocabulary of 701 (no multiple of 8 or 16), a
    wide spread, many ties at the maximum and a gap past the clamp."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((3, 701)) * 2**22).astype(np.int64)
    logits[1, :350] = logits[1].max()
    logits[1, -1] = logits[1].max() - 2**40
    logits[2] = (rng.standard_normal(701) * 300).astype(np.int64)
    return logits


def write_vectors(path: Path, engine: IntegerForward, prompts: Sequence[Sequence[int]],
                  steps: Sequence[Sequence[Sequence[int]]]) -> None:
    """The vector file of ``engine`` (a torch-backend engine): a prefill of ``prompts`` (one
    sequence each, all in one pool), then each of ``steps`` (a chunk per sequence, possibly
    empty) as one forward; tables of every call's logits and of ``synthetic_logits()``."""
    assert engine.backend == "torch", "the expected outputs come from the torch statement"
    batch = engine.new_batch(len(prompts))
    with path.open("wb") as handle:
        out = VectorWriter(handle)
        _write_model(out, engine)
        pool = batch[0].pool
        pool.grow(sum(map(len, prompts)) + sum(max(map(len, step)) for step in steps))
        out.array("pool.planes", pool.planes)
        out.array("pool.shifts", pool.shifts)
        plans = [list(prompts), *[list(step) for step in steps]]
        out.array("calls", len(plans))
        cases = []
        for index, chunks in enumerate(plans):
            calls = [(sequence, chunk) for sequence, chunk in zip(batch, chunks, strict=True)
                     if chunk]
            cases.append(_write_call(out, f"call{index}", engine, calls))
        _write_tables(out, [*cases, synthetic_logits()])

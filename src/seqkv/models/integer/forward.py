"""The integer forward: a Llama-family model whose every reduction is exact integer arithmetic.

A float forward's logits depend on how rows are grouped (prefill, steps, chunks, batches), on
the thread count and on the device, because float sums are not associative. Here every sum is
an integer sum: ``torch._int_mm`` of int8 planes (exact int32), int64 sums, maxima and integer
division. So each output row is a pure function of its sequence's tokens up to it, whatever was
computed with it, on any number of threads, on any device with two's complement int64.

Two paths compute these integers. The torch code here states the forward and is the
reference; ``native.c`` (built and loaded by ``native.py``) computes the same integers with one C
call per decoder layer, where a step of torch operators costs ~18,000 dispatches
(``IntegerForward(backend=...)``: ``auto`` takes native.c where it builds, on any CPU, for
models with two activation planes and summed dimensions that are multiples of 4; ``torch``
forces the reference). ``tests/test_integer_native.py`` asserts the two paths' logits and KV
planes equal bit for bit over chunkings, batches, thread counts and weight planes, on a tiny
model and on SmolLM2-135M, on every instruction set of ``native.ISAS`` that the CPU runs.

Formats (``x`` at ``2**-f`` means the int64 ``x`` stands for ``x / 2**f``):

* residual stream: ``[rows, hidden]`` at ``2**-HIDDEN_FRAC`` (24);
* activations entering a linear layer: per row, ``q = x >> s`` with the smallest ``s >= 0``
  that brings ``|q|`` below ``2**14``, split into two int8 planes ``q = 128 * hi + lo``
  (``hi`` signed, ``lo`` in ``[0, 127]``), stacked as ``[2 * rows, K]`` so one ``_int_mm`` per
  layer serves both planes and all rows of the call. A row's real value is
  ``q * 2**exponent`` (``_Quantized``), so a layer's output is ``(acc * scale) >> shift``;
* RMSNorm: ``y = g * h / rms(h)`` is ``q * sqrt(K) / sqrt(sum q**2 + eps')`` for the 16-bit
  ``q = h >> s``, since the row's scale cancels; ``g`` and ``sqrt(K)`` are folded into the
  weights (``weights.py``); ``q * 2**42 / sqrt(.)`` (``fixedpoint.rsqrt_parts``) is quantized
  again;
* queries, keys, values at ``2**-QKV_FRAC`` (20) after the projection; RoPE with ``2**-30``
  tables; then per (row, head) the same 14-bit planes. The KV pool holds those planes and
  shifts, i.e. a 14-bit floating-point KV cache;
* attention logits in base 2 at ``2**-12``; weights ``round(2**(14 - (max - z)))`` (14-bit
  planes; a weight below ``2**-15`` of the row's largest is 0); the weighted sum of values and
  the sum of weights are exact int64, divided with integer division;
* SiLU as ``x * sigmoid(x)`` from ``fixedpoint.sigmoid``, gate at ``2**-16``;
* logits at ``2**-LOGIT_FRAC`` (16), natural-log units;
* 4-bit layers (``blocks.BlockWeights``, the ``portable4`` level): Q4_1 blocks of 32 weights
  with exact integer scales and minima ``D``, ``M`` at ``2**-24``; a layer's output is the exact
  sum over blocks of ``D * S + M * X`` (``_block_accumulate``: ``S`` the int32 products of a
  block's activations and nibbles, ``X`` the activations' block sum) shifted once; the norms
  before them multiply by the norm weights' integer gains (``_norm``).

NOTE: 14-bit activations, measured (float simulation on the 4 shipped texts, 256 tokens each,
SmolLM2-135M): int8 per-row activations before every linear layer cost +0.6/+3.5/+2.6/+1.2 %
cross-entropy on prose/code/legal/technical, 14 bits +0.00/+0.01/+0.02/-0.00 %. Leaving the
outlier channels (8 per layer, found on random tokens) at 14 bits and the rest at int8 still
cost up to +0.6 %; every layer kind but o_proj contributed (qkv up to +0.75 %, MLP input +0.68,
down_proj input +1.2, head +0.64). So every linear layer takes two activation planes by default;
``IntegerConfig(activation_planes=1)`` (int8) is the faster variant the benchmark reports.

Invariants:
1. Every output row depends only on its sequence's tokens up to and including its position
   (enforced by construction: per-row scales come from that row's own maximum, attention runs
   per sequence with keys up to the row's position, and every reduction is exact).
2. No float operation runs in the forward. Every shift amount lies in [0, 62]: a constant, a
   quantization shift (at most 49), or clamped (enforced). Every product fits int64 for values
   within the bounds stated at each site (assumed: |q|, |k| < 2**11, |gate| < 2**17,
   |silu(gate) * up| < 2**31 in real units; SmolLM2-135M peaks at 21, 49 and ~3,700).
3. ``IntegerForward.forward`` appends each sequence's ids to its pool slot (it mutates the
   sequences' lengths and their pools) and returns int64 logit rows ``[len(ids), vocab]``;
   ``IntSequence.crop`` only shortens (enforced). The engine itself only caches start rows.
4. On CUDA, ``_int_mm`` needs more than 16 rows and sizes in multiples of 8: ``int_matmul``
   pads with zeros, which leaves every integer sum unchanged. Move the weights with
   ``IntegerWeights.to(device)``. Designed for, not tested: this machine has no GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import mpmath  # type: ignore[import-untyped]
import numpy as np
import numpy.typing as npt
import torch

from seqkv.errors import InvalidTokensError
from seqkv.models.adapter import CausalLM
from seqkv.models.integer import native
from seqkv.models.integer.blocks import (
    BLOCK,
    SCALE_FRAC,
    BlockLayer,
    BlockLinear,
    BlockWeights,
    IntGain,
)
from seqkv.models.integer.fixedpoint import (
    EXP2_FRAC_BITS,
    RSQRT_MANTISSA_BITS,
    SOFTMAX_BITS,
    TABLE_BITS,
    FixedPointTables,
    excess_bits,
    rope_tables,
    rsqrt_parts,
    sigmoid,
    softmax_weights,
)
from seqkv.models.integer.weights import (
    HIDDEN_FRAC,
    PLANE_BITS,
    QKV_FRAC,
    IntegerConfig,
    IntegerWeights,
    IntLayer,
    IntLinear,
    PredictorDigest,
    integer_weights,
)
from seqkv.models.pools import (
    PoolWrites,
    finish_call,
    grown,
    pool_writes,
    require_distinct,
)

LOGIT_FRAC = 16  # output logits: natural-log units at 2**-16
ACTIVATION_BITS = 14  # |q| < 2**14: two int8 planes
NORM_BITS = 16  # RMSNorm input: |q| < 2**16, so sum(q**2) < K * 2**32
# NOTE: int32 holds 128 * high + low for sums over K <= 1024 (K * 127 * (2**14 + 127) < 2**31).
_INT32_DEPTH = 1024
GATE_FRAC = 16  # gate and up at 2**-16 (gate * sigmoid * 2**30 < 2**63 for |gate| < 2**17)
_LOGIT_SCALE_BITS = 24
_MASKED = -(1 << 60)
_LOW_MASK = (1 << PLANE_BITS) - 1
_INITIAL_CAPACITY = 64
_HEAD_ROWS = 16
_HEAD_COLUMNS = 4096
_SMALL_ROWS = 16
# NOTE: attention temporaries are [rows, heads, keys] int64; blocks of 32 rows keep them
# cache-sized (with the head's blocking, this more than halves a 256-token prefill).
_ATTENTION_ROWS = 32
_NATIVE_MAX_HEAD_DIM = 1024  # native.c's per-vector and per-head buffers

Backend = native.Backend


def int_matmul(a: torch.Tensor, b: torch.Tensor, pad: bool | None = None) -> torch.Tensor:
    """``a @ b`` for int8 ``a [M, K]`` and ``b [K, N]``, exact int32 ``[M, N]``.

    On CUDA, ``torch._int_mm`` needs M > 16 and K, N multiples of 8: zero rows and columns
    (``pad``, the default on CUDA) keep every sum; designed for, and tested on the CPU only. On
    the CPU ``_int_mm`` takes any shape (measured: M = 1 runs).
    """
    if b.shape[0] == 1:
        # NOTE: measured on this CPU (torch 2.13): with K = 1, a transposed view ([N, 1].t(),
        # strides (1, 1)) returns uninitialized sums for every M and N >= 2 (torch counts it as
        # contiguous, so .contiguous() keeps it); a fresh row-major copy is right.
        b = b.clone(memory_format=torch.contiguous_format)
    if not (a.device.type == "cuda" if pad is None else pad):
        return torch._int_mm(a, b)
    m, k = a.shape
    n = b.shape[1]
    rows, depth, cols = max(32, -(-m // 8) * 8), -(-k // 8) * 8, -(-n // 8) * 8
    padded_a = a.new_zeros((rows, depth))
    padded_a[:m, :k] = a
    padded_b = b.new_zeros((depth, cols))
    padded_b[:k, :n] = b
    return torch._int_mm(padded_a, padded_b)[:m, :n]


@dataclass(frozen=True)
class IntKVState:
    """A sequence's integer keys and values: what ``IntegerForward.new_sequence`` continues."""

    planes: torch.Tensor  # int8 [layers, 2 (keys, values), tokens, 2 (planes), kv_heads, head_dim]
    shifts: torch.Tensor  # int8 [layers, 2, tokens, heads]: real = q * 2**(shift - 20)

    @property
    def length(self) -> int:
        return int(self.planes.shape[2])


class IntKVPool:
    """Integer keys and values of one or more sequences in one buffer."""

    def __init__(self, slots: int, capacity: int, layers: int, heads: int, kv_heads: int,
                 head_dim: int, device: torch.device) -> None:
        capacity = max(1, capacity)
        # [layers, 2 (keys, values), slots, capacity, 2 (planes), kv_heads, head_dim]
        self.planes = torch.zeros((layers, 2, slots, capacity, 2, kv_heads, head_dim),
                                  dtype=torch.int8, device=device)
        # [layers, 2, slots, capacity, heads]: per query head, so no read repeats them; a
        # quantization shift is at most 49, so int8 holds it
        self.shifts = torch.zeros((layers, 2, slots, capacity, heads), dtype=torch.int8,
                                  device=device)

    @property
    def capacity(self) -> int:
        return int(self.planes.shape[3])

    def grow(self, length: int) -> None:
        """Make room for ``length`` positions in every slot, keeping what is held (both
        buffers share the capacity axis and so grow to the same capacity)."""
        self.planes = grown(self.planes, 3, length)
        self.shifts = grown(self.shifts, 3, length)


class IntSequence:
    """One sequence: a slot of an ``IntKVPool`` and how many positions it holds."""

    def __init__(self, pool: IntKVPool, slot: int, length: int = 0) -> None:
        self.pool = pool
        self.slot = slot
        self.length = length

    def state(self) -> IntKVState:
        """The held keys and values (a copy)."""
        return IntKVState(self.pool.planes[:, :, self.slot, : self.length].clone(),
                          self.pool.shifts[:, :, self.slot, : self.length].clone())

    def digest(self, positions: int) -> str:
        """SHA-256 (hex) of the keys' and values' planes and shifts of the first ``positions``
        positions, layer by layer: equal for two sequences exactly when those bits are equal
        (Lemma 1's whole-text comparison of an encoder's and a decoder's predictor,
        ``seqkv.checker.lemma1``). Hashed from the pool's own rows, without a copy."""
        if not 0 <= positions <= self.length:
            raise ValueError(f"a sequence of {self.length} positions has no digest of "
                             f"{positions}")
        hashed = hashlib.sha256()
        for buffer in (self.pool.planes, self.pool.shifts):
            for layer in range(buffer.shape[0]):
                for part in range(buffer.shape[1]):  # keys, values: contiguous rows each
                    rows = buffer[layer, part, self.slot, :positions]
                    hashed.update(rows.contiguous().numpy().data)
        return hashed.hexdigest()

    def crop(self, length: int) -> None:
        """Forget every position at or after ``length``."""
        if not 0 <= length <= self.length:
            raise ValueError(f"a sequence of {self.length} positions cannot be cropped to "
                             f"{length}: crop only shortens")
        self.length = length

    def copy(self) -> IntSequence:
        """The same sequence in a pool of its own."""
        pool = self.pool
        twin = IntKVPool(1, max(_INITIAL_CAPACITY, self.length), pool.planes.shape[0],
                         pool.shifts.shape[4], pool.planes.shape[5], pool.planes.shape[6],
                         pool.planes.device)
        twin.planes[:, :, 0, : self.length] = pool.planes[:, :, self.slot, : self.length]
        twin.shifts[:, :, 0, : self.length] = pool.shifts[:, :, self.slot, : self.length]
        return IntSequence(twin, 0, self.length)


@dataclass(frozen=True)
class _Span:
    """Consecutive rows of one sequence at consecutive positions (at most _ATTENTION_ROWS)."""

    sequence: IntSequence
    start: int  # first row of the call
    count: int
    position: int  # position of the first row
    mask: torch.Tensor | None  # bool [count, 1, position + count]: True where a key is hidden


@dataclass(frozen=True)
class _Quantized:
    """Rows entering a linear layer: ``x = q * 2**exponent`` per row, ``|q| < 2**14``."""

    planes: torch.Tensor  # int8 [2 * rows, K]: the high planes, then the low planes
    exponent: torch.Tensor  # int64 [rows, 1]


class IntegerForward:
    """The integer forward of a Llama-family model (see the module docstring)."""

    def __init__(self, source: CausalLM | IntegerWeights | BlockWeights, *,
                 layers: int | None = None, config: IntegerConfig | None = None,
                 backend: Backend = "auto", isa: native.Isa | None = None) -> None:
        """``backend`` as ``native.load`` chooses it (``auto``), or forced; ``isa`` runs native.c's
        path of that instruction set whatever the environment says (``native.kernels``)."""
        weights = (source if isinstance(source, IntegerWeights | BlockWeights)
                   else integer_weights(source, config))
        geometry = weights.geometry
        total = geometry.layers
        if layers is not None and not 1 <= layers <= total:
            raise ValueError(f"layers must be in 1..{total}, not {layers}")
        self.weights = weights
        self.geometry = geometry
        self.num_layers = total if layers is None else layers
        self._layers: tuple[IntLayer | BlockLayer, ...] = weights.layers[: self.num_layers]
        self.max_positions = geometry.max_positions
        self.vocab_size = geometry.vocab
        self.device = weights.embedding.device
        self._activation_planes = weights.config.activation_planes
        device = self.device
        self._tables = FixedPointTables.on(device)
        heads, kv_heads, head_dim = geometry.heads, geometry.kv_heads, geometry.head_dim
        group = heads // kv_heads
        cos, sin = rope_tables(head_dim, geometry.rope_theta, geometry.max_positions)
        # [P, head_dim]: out = x * cos_full + roll(x, half) * sin_signed (rotate_half convention)
        self._cos = torch.from_numpy(np.concatenate([cos, cos], axis=1)).to(device)
        self._sin = torch.from_numpy(np.concatenate([-sin, sin], axis=1)).to(device)
        # [kv_heads, 1, 1, kv_heads, 1]: places each query group in its KV head's block
        self._block_eye = torch.eye(kv_heads, dtype=torch.int8, device=device).view(
            kv_heads, 1, 1, kv_heads, 1)
        self._head_to_kv = torch.arange(heads, device=device) // group
        with mpmath.workprec(120):
            self._score_scale = int(mpmath.nint(
                mpmath.ldexp(1 / (mpmath.log(2) * mpmath.sqrt(head_dim)), _LOGIT_SCALE_BITS)))
        # eps * K * 2**48 in the units of a row shifted right by s: eps' = term >> 2s
        self._eps_term = torch.tensor(geometry.norm_eps_term, dtype=torch.int64, device=device)
        self._score_shift = _LOGIT_SCALE_BITS + 2 * QKV_FRAC - EXP2_FRAC_BITS
        self._head_pieces = _column_pieces(weights.head, _HEAD_COLUMNS)
        self._gate_up = tuple(_gate_and_up(layer, geometry.intermediate)
                              for layer in self._layers)
        self._start_rows: dict[int, npt.NDArray[np.int64]] = {}
        self._native = self._native_kernels(backend) if isa is None else native.kernels(isa)
        self.backend: Backend = "torch" if self._native is None else "native"
        self.isa: native.Isa | None = None if self._native is None else self._native.isa
        # native.c's packed weights and their row sums, by (weight address, rows, planes)
        self._packed: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._packed_q4: dict[tuple[int, int], torch.Tensor] = {}  # native.c's Q4_1 layout
        self._layer_structs: ctypes.Array[native.LayerStruct] | None = None
        self._head_struct: native.LinearStruct | None = None
        digest = hashlib.sha256(f"{weights.digest()}:layers={self.num_layers}".encode())
        self.digest = PredictorDigest(digest.hexdigest())

    def _native_kernels(self, backend: Backend) -> native.NativeKernels | None:
        """native.c where it can run this model (see the module docstring), else None."""
        if backend == "torch":
            return None
        geometry = self.geometry
        supported = (self.device.type == "cpu" and self._activation_planes == 2
                     and max(geometry.head_dim, geometry.heads) <= _NATIVE_MAX_HEAD_DIM
                     and all(k % 4 == 0 for k in (geometry.hidden, geometry.intermediate,
                                                  geometry.heads * geometry.head_dim)))
        kernels = native.load() if supported else None
        if backend == "native" and kernels is None:
            raise ValueError("the native integer forward needs two activation planes, head_dim "
                             f"and heads <= {_NATIVE_MAX_HEAD_DIM}, summed dimensions that are "
                             "multiples of 4 and a C compiler "
                             f"(and {native.BACKEND_ENV} not set to torch)")
        return kernels

    def new_sequence(self, state: IntKVState | None = None) -> IntSequence:
        """An empty sequence, or one continuing ``state`` (e.g. another sequence's)."""
        geometry = self.geometry
        length = 0 if state is None else state.length
        pool = IntKVPool(1, max(_INITIAL_CAPACITY, length), self.num_layers, geometry.heads,
                         geometry.kv_heads, geometry.head_dim, self.device)
        if state is not None and length:
            if state.planes.shape[0] != self.num_layers:
                raise ValueError(f"the state holds {state.planes.shape[0]} layers, this "
                                 f"predictor runs {self.num_layers}")
            pool.planes[:, :, 0, :length] = state.planes.to(self.device)
            pool.shifts[:, :, 0, :length] = state.shifts.to(self.device)
        return IntSequence(pool, 0, length)

    def new_batch(self, count: int) -> list[IntSequence]:
        """``count`` empty sequences in the slots of one pool: a forward over them writes their
        keys and values with one indexed write per layer."""
        geometry = self.geometry
        pool = IntKVPool(count, _INITIAL_CAPACITY, self.num_layers, geometry.heads,
                         geometry.kv_heads, geometry.head_dim, self.device)
        return [IntSequence(pool, slot) for slot in range(count)]

    def weight_bytes(self) -> int:
        """Bytes of weights one forward reads, whatever its row count: every linear layer of
        the engine's layers and the head, as native.c holds them where it runs (int8 rows
        packed 16 to a block with their int32 row sums and int64 scales; Q4_1 blocks as 20
        bytes per 32 weights, rows padded to 16), else as the torch statement holds them; the
        norm gains and biases. The embedding row of each input and the KV are not counted."""
        def linear_bytes(linear: IntLinear | BlockLinear) -> int:
            rows = -(-linear.out_features // native.LANES) * native.LANES
            bias = 0 if linear.bias is None else linear.bias.numel() * 8
            if isinstance(linear, BlockLinear):
                if self._native is None:  # nibbles as int8, D and M as int64
                    return linear.quants.numel() + 16 * linear.scale.numel() + bias
                return rows * linear.in_features // BLOCK * 20 + bias
            if self._native is None:
                return linear.weight.numel() + linear.scale.numel() * 8 + bias
            return (rows * linear.in_features * linear.planes + rows * linear.planes * 4
                    + linear.out_features * 8 + bias)

        total = linear_bytes(self.weights.head)
        for layer in self._layers:
            total += sum(linear_bytes(part) for part in (layer.qkv, layer.o, layer.gate_up,
                                                         layer.down))
            if isinstance(layer, BlockLayer):
                total += 8 * (layer.attention_gain.values.numel() + layer.mlp_gain.values.numel())
        return total

    def start_row(self, token: int) -> npt.NDArray[np.int64]:
        """The row after ``token`` alone at position 0, computed once (read-only)."""
        row = self._start_rows.get(token)
        if row is None:
            row = self.forward([(self.new_sequence(), [token])])[0][0]
            row.setflags(write=False)
            self._start_rows[token] = row
        return row

    @torch.inference_mode()
    def forward(self, calls: Sequence[tuple[IntSequence, Sequence[int]]],
                out: npt.NDArray[np.int64] | None = None) -> list[npt.NDArray[np.int64]]:
        """Append each sequence's ids in one forward; return int64 logit rows ``[len(ids), V]``
        at ``2**-LOGIT_FRAC``. A sequence may appear once per call. With ``out`` (int64, C
        order, ``[>= all ids, V]``), the rows are written there and returned as its views: a
        caller that forwards chunk after chunk reuses one buffer instead of faulting in a
        fresh ``[rows, V]`` each time."""
        require_distinct(sequence for sequence, _ in calls)
        if out is not None:
            total = sum(len(chunk) for _, chunk in calls)
            if (out.dtype != np.int64 or out.ndim != 2 or out.shape[0] < total
                    or out.shape[1] != self.vocab_size or not out.flags.c_contiguous):
                raise ValueError(f"out must be C-contiguous int64 [>= {total}, "
                                 f"{self.vocab_size}], not {out.dtype} {list(out.shape)}")
        spans, ids, positions = self._plan(calls)
        if not spans:
            return [np.zeros((0, self.vocab_size), dtype=np.int64) for _ in calls]
        device = self.device
        token_ids = torch.tensor(ids, dtype=torch.long, device=device)
        position_ids = torch.tensor(positions, dtype=torch.long, device=device)
        shift = HIDDEN_FRAC - self.weights.embedding_frac
        hidden = self.weights.embedding[token_ids].to(torch.int64) << shift  # [N, hidden]
        if self._native is not None:  # one native.c call for the layers, the same integers
            threads = torch.get_num_threads()
            self._native.call("seqkv_layers", self._layer_array(), self.num_layers, hidden,
                              hidden.shape[0], position_ids, self._native_spans(spans),
                              len(spans), threads)
            return finish_call(calls, self._native_head(hidden, threads, out))
        writes = _pool_writes(spans, device)
        cos, sin = self._cos[position_ids][:, None], self._sin[position_ids][:, None]
        for index, layer in enumerate(self._layers):
            hidden = hidden + self._attention(index, layer, hidden, cos, sin, spans, writes)
            hidden = hidden + self._mlp(index, layer, hidden)
        logits = self._head(hidden)
        if out is not None:
            out[: logits.shape[0]] = logits
            logits = out[: logits.shape[0]]
        return finish_call(calls, logits)

    def _native_spans(self, spans: list[_Span]) -> ctypes.Array[native.SpanStruct]:
        table = (native.SpanStruct * len(spans))()
        for entry, span in zip(table, spans, strict=True):
            pool = span.sequence.pool
            planes, shifts = pool.planes, pool.shifts  # int8: strides are bytes
            # native.c steps through a slot's positions as in a contiguous pool
            assert planes.is_contiguous() and shifts.is_contiguous()
            entry.start, entry.count, entry.position = span.start, span.count, span.position
            entry.planes = planes.data_ptr() + span.sequence.slot * planes.stride(2)
            entry.shifts = shifts.data_ptr() + span.sequence.slot * shifts.stride(2)
            entry.plane_layer_stride, entry.plane_kv_stride = planes.stride(0), planes.stride(1)
            entry.shift_layer_stride, entry.shift_kv_stride = shifts.stride(0), shifts.stride(1)
        return table

    def _layer_array(self) -> ctypes.Array[native.LayerStruct]:
        """native.c's descriptions of the layers (built once; they point into tensors this
        engine holds)."""
        if self._layer_structs is None:
            self._layer_structs = (native.LayerStruct * self.num_layers)(
                *[self._layer_struct(index) for index in range(self.num_layers)])
        return self._layer_structs

    def _layer_struct(self, index: int) -> native.LayerStruct:
        """native.c's description of layer ``index``."""
        layer, geometry = self._layers[index], self.geometry
        gate, up = self._gate_up[index]
        tables = self._tables
        gains = ((layer.attention_gain, layer.mlp_gain) if isinstance(layer, BlockLayer)
                 else (None, None))
        return native.LayerStruct(
            qkv=self._linear_struct(layer.qkv), o=self._linear_struct(layer.o),
            gate=self._linear_struct(gate), up=self._linear_struct(up),
            down=self._linear_struct(layer.down), rsqrt=tables.rsqrt.data_ptr(),
            sigmoid=tables.sigmoid.data_ptr(), softmax=tables.softmax.data_ptr(),
            cos=self._cos.data_ptr(), sin=self._sin.data_ptr(),
            softmax_size=tables.softmax.shape[0], eps_term=int(geometry.norm_eps_term),
            heads=geometry.heads, kv_heads=geometry.kv_heads, head_dim=geometry.head_dim,
            score_scale=self._score_scale, score_shift=self._score_shift, qkv_frac=QKV_FRAC,
            hidden_frac=HIDDEN_FRAC, gate_frac=GATE_FRAC, mantissa_bits=RSQRT_MANTISSA_BITS,
            attention_offset=-(QKV_FRAC + SOFTMAX_BITS), mlp_offset=-2 * GATE_FRAC,
            attention_gain=None if gains[0] is None else gains[0].values.data_ptr(),
            mlp_gain=None if gains[1] is None else gains[1].values.data_ptr(),
            attention_gain_frac=0 if gains[0] is None else gains[0].frac,
            mlp_gain_frac=0 if gains[1] is None else gains[1].frac)

    def _linear_struct(self, linear: IntLinear | BlockLinear) -> native.LinearStruct:
        if isinstance(linear, BlockLinear):
            return native.LinearStruct(
                packed=self._packed_blocks(linear).data_ptr(), sums=None, scale=None,
                bias=None if linear.bias is None else linear.bias.data_ptr(), scale_bits=0,
                planes=1, n_out=linear.out_features, k=linear.in_features,
                kind=native.LINEAR_Q4)
        packed, sums = self._packed_weight(linear)
        return native.LinearStruct(
            packed=packed.data_ptr(), sums=sums.data_ptr(), scale=linear.scale.data_ptr(),
            bias=None if linear.bias is None else linear.bias.data_ptr(),
            scale_bits=linear.scale_bits, planes=linear.planes, n_out=linear.out_features,
            k=linear.in_features, kind=native.LINEAR_INT8)

    def _packed_weight(self, linear: IntLinear) -> tuple[torch.Tensor, torch.Tensor]:
        key = (linear.weight.data_ptr(), linear.out_features, linear.planes)
        packed = self._packed.get(key)
        if packed is None:
            packed = native.pack_weight(linear.weight, linear.planes)
            self._packed[key] = packed
        return packed

    def _packed_blocks(self, linear: BlockLinear) -> torch.Tensor:
        key = (linear.quants.data_ptr(), linear.out_features)
        packed = self._packed_q4.get(key)
        if packed is None:
            packed = native.pack_blocks(linear.quants, *linear.halves())
            self._packed_q4[key] = packed
        return packed

    def _native_head(self, hidden: torch.Tensor, threads: int,
                     out: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.int64]:
        """``_head`` by native.c, straight into the result (no [rows, vocab] temporary)."""
        assert self._native is not None
        if self._head_struct is None:
            self._head_struct = self._linear_struct(self.weights.head)
        shape = (hidden.shape[0], self.vocab_size)
        logits = np.empty(shape, dtype=np.int64) if out is None else out[: shape[0]]
        self._native.call("seqkv_head", self._layer_array(), self._head_struct, hidden,
                          hidden.shape[0], LOGIT_FRAC, logits, threads)
        return logits

    def _head(self, hidden: torch.Tensor) -> npt.NDArray[np.int64]:
        """Final norm and output layer, in blocks of rows and columns (int64 ``[N, V]``).

        NOTE: a [256, 49152] int64 temporary costs its page faults on every allocation (a
        multiply in place or in 8-row blocks avoids them), and a 16-row product with all 49,152
        columns runs at about twice the time per row of slices of 4,096 columns, whose
        operands stay in cache. So blocks of ``_HEAD_ROWS`` rows meet slices of
        ``_HEAD_COLUMNS`` columns (a single row costs the same either way).
        """
        rows = hidden.shape[0]
        logits = np.empty((rows, self.vocab_size), dtype=np.int64)
        for start in range(0, rows, _HEAD_ROWS):
            block = hidden[start : start + _HEAD_ROWS]
            x = self._norm(block)
            end = start + block.shape[0]
            for column, piece in self._head_pieces:
                out = self._linear(x, piece, LOGIT_FRAC)
                logits[start:end, column : column + piece.out_features] = out.cpu().numpy()
        return logits

    def _plan(self, calls: Sequence[tuple[IntSequence, Sequence[int]]]
              ) -> tuple[list[_Span], list[int], list[int]]:
        spans: list[_Span] = []
        ids: list[int] = []
        positions: list[int] = []
        for sequence, chunk in calls:
            if not chunk:
                continue
            end = sequence.length + len(chunk)
            if end > self.max_positions:
                raise InvalidTokensError(
                    f"a sequence of {end} tokens exceeds the model's {self.max_positions} "
                    "positions")
            bad = [t for t in chunk if not 0 <= int(t) < self.vocab_size]
            if bad:
                raise InvalidTokensError(
                    f"token id {bad[0]} is outside the vocabulary of {self.vocab_size}")
            sequence.pool.grow(end)
            for offset in range(0, len(chunk), _ATTENTION_ROWS):
                count = min(_ATTENTION_ROWS, len(chunk) - offset)
                position = sequence.length + offset
                mask = None
                if count > 1:
                    keys = torch.arange(position + count, device=self.device)
                    rows = torch.arange(position, position + count, device=self.device)
                    mask = (keys[None, :] > rows[:, None])[:, None, :]  # [count, 1, keys]
                spans.append(_Span(sequence, len(ids) + offset, count, position, mask))
            positions.extend(range(sequence.length, end))
            ids.extend(int(t) for t in chunk)
        return spans, ids, positions

    def _norm(self, hidden: torch.Tensor, gain: IntGain | None = None) -> _Quantized:
        """RMSNorm (weights and sqrt(K) folded into the next layer, or ``gain``) as 14-bit
        planes.

        ``h / rms(h) = q * sqrt(K) / sqrt(sum q**2 + eps')`` for ``q = h >> s`` (16 bits): the
        row's scale cancels. ``q * 2**42 / sqrt(.)`` is quantized again to 14 bits, so every
        later product needs one shift per row and no multiply (measured: two fewer passes
        over each norm-fed layer's output, the head's [rows, 49152] among them). A 4-bit layer
        cannot hold the norm's weight (``blocks.py``): its ``gain`` (``g * sqrt(K)`` at
        ``2**-frac``, at most 2**16) multiplies ``q`` first, ``|q * G * mantissa| < 2**62``.
        """
        shift = excess_bits(_peak(hidden), NORM_BITS, self._tables)  # [rows, 1]
        q = hidden >> shift
        squares = (q * q).sum(-1, keepdim=True)  # < K * 2**32
        eps = self._eps_term >> (shift << 1).clamp_(max=62)
        mantissa, half = rsqrt_parts(squares + eps, self._tables)
        if gain is None:
            _, planes, exponent = self._quantize(q * mantissa)  # < 2**16 * 2**30
            return _Quantized(planes, exponent - half - RSQRT_MANTISSA_BITS)
        _, planes, exponent = self._quantize(q * gain.values * mantissa)
        return _Quantized(planes, exponent - half - RSQRT_MANTISSA_BITS - gain.frac)

    def _quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row: ``q = x >> s`` below 2**14 (2**7 for one activation plane), its planes
        ``[planes * rows, K]``, and ``s``."""
        rows = x.shape[0]
        peak = _peak(x)
        if self._activation_planes == 1:
            # NOTE: int8 rows round to nearest: flooring biases every element by half a step,
            # 1/256 of the row's maximum, which adds up coherently in the products (measured
            # on the tiny Llama: largest logit error 0.032 floored, 0.011 rounded). 14-bit rows
            # floor (rounding them changed the KL to the float model by 3%, 0.0116 -> 0.0113 nats):
            # their bias is 2**-15 of the maximum.
            shift = excess_bits(peak, PLANE_BITS, self._tables)
            q = ((x + ((1 << shift) >> 1)) >> shift).clamp_(max=(1 << PLANE_BITS) - 1)
            return q, q.to(torch.int8), shift
        shift = excess_bits(peak, ACTIVATION_BITS, self._tables)
        q = x >> shift
        if rows <= _SMALL_ROWS:
            planes = torch.cat((q >> PLANE_BITS, q & _LOW_MASK)).to(torch.int8)
        else:
            # NOTE: large blocks write the planes straight into int8 (no int64 temporary of
            # twice the rows); small ones take the path with fewer torch calls.
            planes = torch.empty((2 * rows, x.shape[1]), dtype=torch.int8, device=x.device)
            planes[:rows] = q >> PLANE_BITS
            planes[rows:] = q & _LOW_MASK
        return q, planes, shift

    def _accumulate(self, planes: torch.Tensor, linear: IntLinear) -> torch.Tensor:
        """The exact products ``[rows, N]`` of the activation rows and the layer's integers
        (int32 when they fit, else int64)."""
        weight = linear.weight.t()  # [K, planes * N]
        n = linear.out_features
        if self._activation_planes == 1:
            raw = int_matmul(planes, weight)  # [rows, planes * N], |.| < K * 2**14
            if linear.planes == 1:
                return raw
            return torch.add(raw[:, n:], raw[:, :n], alpha=1 << PLANE_BITS)
        rows = planes.shape[0] // 2
        # NOTE: one product for both planes, also for a single row: in cache two one-row
        # products are faster, but a step reads each layer's weights from memory, where
        # reading them once wins (reports/code_notes.md).
        raw = int_matmul(planes, weight)  # [2 * rows, planes * N]
        high, low = raw[:rows], raw[rows:]
        wide = linear.planes > 1 or linear.in_features > _INT32_DEPTH
        if wide:
            high, low = high.to(torch.int64), low.to(torch.int64)
        if linear.planes > 1:
            high = torch.add(high[:, n:], high[:, :n], alpha=1 << PLANE_BITS)
            low = torch.add(low[:, n:], low[:, :n], alpha=1 << PLANE_BITS)
        return torch.add(low, high, alpha=1 << PLANE_BITS)

    def _linear(self, x: _Quantized, linear: IntLinear | BlockLinear, out_frac: int
                ) -> torch.Tensor:
        """``x @ W.T (+ b)`` at ``2**-out_frac`` (int64 ``[rows, N]``)."""
        if isinstance(linear, BlockLinear):
            acc = _block_accumulate(x.planes, linear)  # at 2**(exponent - 24)
            result = acc >> (SCALE_FRAC - out_frac - x.exponent).clamp_(0, 62)
            return result if linear.bias is None else result + linear.bias
        acc = self._accumulate(x.planes, linear)
        return _scale(acc, linear.scale, linear.scale_bits, x.exponent, out_frac, linear.bias)

    def _attention(self, index: int, layer: IntLayer | BlockLayer, hidden: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, spans: list[_Span],
                   writes: list[PoolWrites[IntKVPool]]) -> torch.Tensor:
        geometry = self.geometry
        heads, kv_heads, head_dim = geometry.heads, geometry.kv_heads, geometry.head_dim
        n = hidden.shape[0]
        gain = layer.attention_gain if isinstance(layer, BlockLayer) else None
        qkv = self._linear(self._norm(hidden, gain), layer.qkv, QKV_FRAC)
        qkv = qkv.view(n, heads + 2 * kv_heads, head_dim)  # [N, heads, head_dim] at 2**-20
        rotated = heads + kv_heads
        qk = qkv[:, :rotated]
        # |q|, |k| < 2**11 real: below 2**31 at 2**-20, times 2**30 below 2**62.
        qkv[:, :rotated] = (qk * cos + qk.roll(head_dim // 2, dims=-1) * sin) >> TABLE_BITS
        shift = excess_bits(_peak(qkv), ACTIVATION_BITS, self._tables)  # [N, heads, 1]
        q = qkv >> shift
        planes = torch.stack((q >> PLANE_BITS, q & _LOW_MASK), dim=2).to(torch.int8)
        shift = shift[..., 0]  # [N, heads + 2 kv_heads]
        # key and value shifts per query head: [N, 2, heads]
        kv_shift = shift[:, heads:].view(n, 2, kv_heads).index_select(2, self._head_to_kv).to(
            torch.int8)
        for write in writes:
            # [2 (keys, values), R, 2 (planes), kv_heads, head_dim]
            new = planes[write.rows, heads:].view(-1, 2, kv_heads, 2, head_dim)
            write.pool.planes[index][:, write.slots, write.positions] = new.permute(1, 0, 3, 2, 4)
            write.pool.shifts[index][:, write.slots, write.positions] = (
                kv_shift[write.rows].permute(1, 0, 2))
        if len(spans) == 1:
            out, exponent = self._attend(index, planes[:, :heads], shift[:, :heads], spans[0])
        else:
            out = hidden.new_empty((n, heads, head_dim))
            exponent = hidden.new_empty((n, 1))
            for span in spans:
                rows = slice(span.start, span.start + span.count)
                out[rows], exponent[rows] = self._attend(
                    index, planes[rows, :heads], shift[rows, :heads], span)
        _, o_planes, o_shift = self._quantize(out.view(n, heads * head_dim))
        x = _Quantized(o_planes, o_shift + exponent - (QKV_FRAC + SOFTMAX_BITS))
        return self._linear(x, layer.o, HIDDEN_FRAC)

    def _attend(self, index: int, q_planes: torch.Tensor, q_shift: torch.Tensor, span: _Span
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's rows against its keys up to each row's position.

        Returns the outputs ``[n, heads, head_dim]``, each row of all heads at
        ``2**(exponent - QKV_FRAC - 14)``, and that exponent ``[n, 1]``.
        """
        geometry = self.geometry
        heads, kv_heads, head_dim = geometry.heads, geometry.kv_heads, geometry.head_dim
        group = heads // kv_heads
        n, end = span.count, span.position + span.count
        sequence = span.sequence
        pool_planes = sequence.pool.planes[index, :, sequence.slot, :end]  # [2, T, 2, kvh, D]
        pool_shifts = sequence.pool.shifts[index, :, sequence.slot, :end]  # [2, T, heads]
        # Block-diagonal queries: head h of KV group g only meets the keys of g. [n*heads*2, kvh*D]
        queries = (q_planes.reshape(n, kv_heads, group, 2, 1, head_dim) * self._block_eye
                   ).view(n * heads * 2, kv_heads * head_dim)
        keys = pool_planes[0].reshape(2 * end, kv_heads * head_dim)  # rows: (token, plane)
        raw = int_matmul(queries, keys.t()).view(n, heads, 2, end, 2)
        # key planes in int32: |.| <= D * 128 * (2**14 + 127) < 2**31 for D <= 1024
        by_key = torch.add(raw[..., 1], raw[..., 0], alpha=1 << PLANE_BITS)  # [n, heads, 2, T]
        dot = torch.add(by_key[:, :, 1], by_key[:, :, 0].to(torch.int64),
                        alpha=1 << PLANE_BITS)  # [n, heads, T], |dot| < D * 2**28
        # logit * log2(e) at 2**-12 = dot * 2**(sq + sk - 40) / sqrt(D) / ln 2 * 2**12
        amount = (self._score_shift - q_shift)[:, :, None] - pool_shifts[0].t()[None]
        z = (dot * self._score_scale) >> amount.clamp(0, 62)  # [n, heads, T]
        if span.mask is not None:
            z = z.masked_fill(span.mask, _MASKED)
        weights = softmax_weights(z.amax(-1, keepdim=True) - z, self._tables)
        total = weights.sum(-1, keepdim=True)  # [n, heads, 1], >= 2**14 - 1
        # Values carry per-token exponents: scale each weight to the largest exponent seen up
        # to the row's position (a running maximum, so later tokens never matter).
        value_shift = pool_shifts[1]  # [T, heads]
        running = value_shift.cummax(0).values[span.position : end]  # [n, heads]
        scaled = weights >> (running[:, :, None] - value_shift.t()[None]).clamp(0, 62)
        w_planes = torch.stack((scaled >> PLANE_BITS, scaled & _LOW_MASK), dim=2).to(torch.int8)
        values = pool_planes[1].reshape(end, 2 * kv_heads * head_dim)  # [T, (plane, kvh, D)]
        raw = int_matmul(w_planes.view(n * heads * 2, end), values)
        # [n, kvh, group, 2 (weight plane), 2 (value plane), kvh, D] -> its diagonal in kvh
        blocks = raw.view(n, kv_heads, group, 2, 2, kv_heads, head_dim)
        diagonal = torch.diagonal(blocks, dim1=1, dim2=5).to(torch.int64)  # [n, g, 2, 2, D, kvh]
        by_value = torch.add(diagonal[:, :, :, 1], diagonal[:, :, :, 0], alpha=1 << PLANE_BITS)
        summed = torch.add(by_value[:, :, 1], by_value[:, :, 0], alpha=1 << PLANE_BITS)
        summed = summed.permute(0, 3, 1, 2).reshape(n, heads, head_dim)  # from [n, g, D, kvh]
        # |summed| <= T * 2**28 <= 2**41: shifted by 14 it stays below 2**55.
        out = torch.div(summed << SOFTMAX_BITS, total, rounding_mode="floor")
        exponent = running.amax(-1, keepdim=True)  # [n, 1]
        return out >> (exponent - running)[:, :, None], exponent

    def _mlp(self, index: int, layer: IntLayer | BlockLayer, hidden: torch.Tensor
             ) -> torch.Tensor:
        x = self._norm(hidden, layer.mlp_gain if isinstance(layer, BlockLayer) else None)
        # NOTE: gate and up as two products of 1,536 columns: one product with all 3,072
        # columns is slower than the two halves (its output leaves the cache).
        gate_linear, up_linear = self._gate_up[index]
        gate = self._linear(x, gate_linear, GATE_FRAC)
        up = self._linear(x, up_linear, GATE_FRAC)
        silu = (gate * sigmoid(gate, GATE_FRAC, self._tables)) >> TABLE_BITS
        _, planes, shift = self._quantize(silu * up)  # |silu|, |up| < 2**23: below 2**46
        inner = _Quantized(planes, shift - 2 * GATE_FRAC)
        return self._linear(inner, layer.down, HIDDEN_FRAC)


def _peak(x: torch.Tensor) -> torch.Tensor:
    """``max |x|`` over the last dimension, kept as ``[..., 1]``.

    NOTE: large blocks take one pass for both extremes, where abs would write a whole
    temporary first; for a few rows the two small calls are fewer torch calls.
    """
    if x.shape[0] <= _SMALL_ROWS:
        return x.abs().amax(-1, keepdim=True)
    low, high = torch.aminmax(x, dim=-1, keepdim=True)
    return torch.maximum(-low, high)


def _scale(acc: torch.Tensor, scale: torch.Tensor, scale_bits: int, exponent: torch.Tensor,
           out_frac: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``acc * scale * 2**(exponent - scale_bits)`` at ``2**-out_frac``: ``acc * scale`` is below
    2**58, and the per-row right shift is non-negative for activations and weights within the
    assumed bounds (|values| < 2**11 real, weights below 2**9); it is clamped at 0."""
    result = (acc * scale) >> (scale_bits - out_frac - exponent).clamp_(0, 62)
    return result if bias is None else result + bias


def _block_accumulate(planes: torch.Tensor, linear: BlockLinear) -> torch.Tensor:
    """The exact sums ``sum_b (D[n, b] * S[r, n, b] + M[n, b] * X[r, b])`` (int64 ``[rows, N]``)
    of 14-bit activation rows (planes ``[2 * rows, K]``) and Q4_1 blocks (``blocks.py``):
    ``S`` the int32 product of the block's 32 activations and nibbles, ``X`` the activations'
    block sum. ``|D * S| < 2**31 * 2**23``, and the whole sum is bounded below 2**62 by
    ``blocks.block_linear``.
    """
    rows = planes.shape[0] // 2
    q = (planes[:rows].to(torch.int64) << PLANE_BITS) + planes[rows:]  # [rows, K], < 2**14
    sums = q.view(rows, -1, BLOCK).sum(-1)  # [rows, B]: X
    acc = sums @ linear.minimum.t()  # [rows, N]
    for b in range(linear.scale.shape[1]):
        columns = slice(b * BLOCK, (b + 1) * BLOCK)
        raw = int_matmul(planes[:, columns].contiguous(), linear.quants[:, columns].t())
        block = torch.add(raw[rows:], raw[:rows], alpha=1 << PLANE_BITS)  # [rows, N]: S
        acc += block.to(torch.int64) * linear.scale[:, b]
    return acc


def _gate_and_up(layer: IntLayer | BlockLayer, width: int
                 ) -> tuple[IntLinear | BlockLinear, IntLinear | BlockLinear]:
    """A layer's gate and up projections (the first and second ``width`` rows of gate_up)."""
    if isinstance(layer, BlockLayer):
        return layer.gate_up.rows(0, width), layer.gate_up.rows(width, 2 * width)
    (_, gate), (_, up) = _column_pieces(layer.gate_up, width)
    return gate, up


def _column_pieces(linear: IntLinear, width: int) -> tuple[tuple[int, IntLinear], ...]:
    """``linear`` cut into slices of at most ``width`` output rows, with their first column."""
    n = linear.out_features
    pieces = []
    for start in range(0, n, width):
        end = min(n, start + width)
        if linear.planes == 1:
            weight = linear.weight[start:end]  # a view
        else:
            weight = torch.cat([linear.weight[p * n + start : p * n + end]
                                for p in range(linear.planes)])
        pieces.append((start, replace(
            linear, weight=weight, scale=linear.scale[start:end],
            bias=None if linear.bias is None else linear.bias[start:end])))
    return tuple(pieces)


def _pool_writes(spans: list[_Span], device: torch.device) -> list[PoolWrites[IntKVPool]]:
    entries = ((span.sequence.pool, span.sequence.slot, span.start, span.count, span.position)
               for span in spans)
    return pool_writes(entries, device)

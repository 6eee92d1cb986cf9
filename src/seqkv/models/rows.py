"""A row-invariant forward: every output row is bit-identical however rows are grouped.

The codec's probabilities must be reproduced bit for bit by the decoder. With transformers'
forward that pins the schedule: one prefill, token-by-token steps and chunks of any size give
logits that differ by up to ~1e-4 (measured by the lab's ``research/decoding/probes.py``). A CPU
matrix product gives a row the same bits in products of different row counts M only from some M
on, and that threshold depends on the machine: with torch 2.13 (MKL), one Xeon gave every row
the bits of a larger product from M = 4 on one thread, another (this project's CI kind, an
AVX-512 Xeon with the same torch) only from M = 16; on two threads the second changed the bits
of the 1536 -> 576 product for M = 57 to 101. So the forward runs on one thread and measures its row
block once per model on the machine it runs on (``calibrate_row_block``), and computes the model
as

* every linear layer on all rows of the call at once, padded with zero rows to at least the
  calibrated row block;
* norms, rotary embeddings, activations: elementwise or per-row reductions (row-invariant);
* attention for each row on its own, against its sequence's keys and values up to and including
  its position, with a call whose shape depends on that position only;
* rotary tables computed once for all positions up to the model's maximum, in one call.

A row's output then depends only on its sequence's tokens up to it, never on which other rows,
sequences, chunk boundaries or thread counts shared the forward. That one property makes a fast
encoder (all positions in large chunks), speculative decoding (guessed rows are correct up to the
first wrong guess) and batched decoding of many sessions (one forward serves all) exact.

Invariants:
1. The model's architecture is one with a ``Backbone`` (``seqkv.models.backbones``): the engine
   runs the backbone's embedding, blocks and head, and owns only the attention core (the KV pool
   and per-row attention); other architectures are refused with UnsupportedModelError naming
   the model type (enforced by ``backbone_for``).
2. ``RowForward.forward`` appends each sequence's ids at its next positions and returns one logit
   row per id; ``RowSequence.crop`` only shortens (enforced).
3. Row invariance holds for every product of at least ``row_block`` rows on this machine
   (checked: ``calibrate_row_block`` probes every linear shape of the model, with its bias when
   it has one, with random inputs at construction and refuses a machine where no block up to
   ``PROBE_ROWS`` works; the decoder verifies checksums in any case; ``tests/test_rows.py`` and
   ``tests/test_backbones.py`` check the property on every run, for every backbone).
4. ``row_forward`` builds one engine per model and keeps it with the model (``CausalLM.derived``);
   a forward mutates only the pools of the sequences it is given and the ``forwards`` counter.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from seqkv.errors import InvalidTokensError, UnsupportedModelError
from seqkv.models.adapter import CausalLM
from seqkv.models.backbones import BackboneGeometry, backbone_for
from seqkv.models.pools import (
    PoolWrites,
    finish_call,
    grown,
    pool_writes,
    require_distinct,
)

# NOTE: the largest row block the calibration accepts: a forward pads every product to at least
# this many rows, so a larger block would make single-row decoding too slow to be worth it.
PROBE_ROWS = 64
# NOTE: products of up to 256 rows (the encoder's chunk) are checked against the block; the LM
# head's 49,152 outputs are probed on their first 4,096 (the kernel's path depends on the row
# count, not on how many output columns follow).
_PROBE_REFERENCE_ROWS = 256
_PROBE_MAX_OUTPUTS = 4096
ROW_THREADS = 1
_INITIAL_CAPACITY = 64
# NOTE: rows per forward of ``RowForward.recompute``: the encoder's chunk
# (``seqkv.levels.portable.ENCODE_CHUNK_ROWS``), so recomputing a tail costs the forwards an
# encode's chunks cost (forward counts are gated figures; the rows themselves do not depend on
# the chunk).
RECOMPUTE_CHUNK_ROWS = 256
# NOTE: a forward's per-row attention calls are shared with one helper thread when they read at
# least this many keys in all (a 256-row chunk from position ~16 on): the hand-off costs
# about as much as a call over a few hundred keys, and on long texts these calls are most of a
# ``rows``-schedule forward, all on one core otherwise.
PARALLEL_ATTENTION_KEYS = 4096


_Part = Sequence[tuple[int, torch.Tensor, torch.Tensor, int]]


class KVPool:
    """Keys and values of one or more sequences in one buffer, so one indexed write per layer
    stores a whole forward's new keys (16 sequences: 60 writes per forward instead of 960)."""

    def __init__(self, slots: int, capacity: int, layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        # [layers, 2 (keys, values), slots, kv_heads, capacity, head_dim]
        self.buffer = torch.zeros((layers, 2, slots, kv_heads, max(1, capacity), head_dim),
                                  dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        return int(self.buffer.shape[4])

    def grow(self, length: int) -> None:
        """Make room for ``length`` positions in every slot, keeping what is held."""
        self.buffer = grown(self.buffer, 4, length)


class RowSequence:
    """One sequence: a slot of a ``KVPool`` and how many positions it holds."""

    def __init__(self, pool: KVPool, slot: int, length: int = 0) -> None:
        self.pool = pool
        self.slot = slot
        self.length = length

    def reserve(self, length: int) -> None:
        self.pool.grow(length)

    def kv(self) -> torch.Tensor:
        """The held keys and values as ``[layers, 2, kv_heads, length, head_dim]`` (a copy)."""
        return self.pool.buffer[:, :, self.slot, :, : self.length].clone()

    def crop(self, length: int) -> None:
        """Forget every position at or after ``length``."""
        assert 0 <= length <= self.length, "a sequence can only be shortened"
        self.length = length

    def copy(self) -> RowSequence:
        """The same sequence in a pool of its own."""
        (twin,) = gather([self], self.pool.capacity)
        return twin


def gather(sequences: Sequence[RowSequence], capacity: int) -> list[RowSequence]:
    """Copies of ``sequences`` in one new pool with room for ``capacity`` positions each."""
    assert sequences, "gather needs at least one sequence"
    first = sequences[0].pool.buffer
    layers, _, _, kv_heads, _, head_dim = first.shape
    needed = max([capacity, *(s.length for s in sequences)])
    pool = KVPool(len(sequences), needed, layers, kv_heads, head_dim, first.dtype, first.device)
    copies = []
    for slot, sequence in enumerate(sequences):
        held = sequence.length
        pool.buffer[:, :, slot, :, :held] = sequence.pool.buffer[:, :, sequence.slot, :, :held]
        copies.append(RowSequence(pool, slot, held))
    return copies


def _pool_writes(spans: list[_Span], sequences: list[RowSequence],
                 device: torch.device) -> list[PoolWrites[KVPool]]:
    entries = ((sequences[span.sequence].pool, sequences[span.sequence].slot, span.rows.start,
                span.rows.stop - span.rows.start, span.position) for span in spans)
    return pool_writes(entries, device)


@dataclass(frozen=True)
class _Span:
    """One sequence's rows in a call: consecutive rows at consecutive positions."""

    sequence: int  # index into the call's sequences
    rows: slice  # rows of the call
    position: int  # position of the first row


@torch.inference_mode()
def calibrate_row_block(model: CausalLM, seed: int = 0) -> int:
    """The fewest rows from which every linear product of ``model`` is row-invariant here.

    For each distinct linear shape, random inputs go through products of every row count from 1
    to ``PROBE_ROWS`` and a few larger ones (and at a few row offsets); the block is the
    smallest count from which every product gives each row the bits it has in a 256-row product.
    A layer with a bias is probed with one (the product then adds it in the same kernel call).
    Runs on one thread, the forward's schedule.
    """
    shapes = sorted({(min(int(m.out_features), _PROBE_MAX_OUTPUTS), int(m.in_features),
                      m.bias is not None)
                     for m in model.model.modules() if isinstance(m, torch.nn.Linear)})
    generator = torch.Generator().manual_seed(seed)
    counts = [*range(1, PROBE_ROWS + 1), 96, 128, 192, _PROBE_REFERENCE_ROWS]
    block = 1
    with _threads(ROW_THREADS):
        for out_features, in_features, biased in shapes:
            weight = torch.randn(out_features, in_features, generator=generator,
                                 dtype=model.dtype).to(model.device)  # [out, in]
            x = torch.randn(_PROBE_REFERENCE_ROWS + 32, in_features, generator=generator,
                            dtype=model.dtype).to(model.device)  # [R + 32, in]
            bias = (torch.randn(out_features, generator=generator,
                                dtype=model.dtype).to(model.device) if biased else None)  # [out]
            full = F.linear(x, weight, bias)  # [R + 32, out]
            varying = [m for m in counts
                       if not torch.equal(F.linear(x[:m], weight, bias), full[:m])]
            varying += [m for m in range(1, PROBE_ROWS + 1) for offset in (1, 7, 29)
                        if not torch.equal(F.linear(x[offset : offset + m], weight, bias),
                                           full[offset : offset + m])]
            first = max(varying, default=0) + 1
            if first > PROBE_ROWS:
                raise UnsupportedModelError(
                    f"on this machine a {in_features} -> {out_features} matrix product changes "
                    f"the bits of its rows with the row count up to {max(varying)} rows: the "
                    "rows-based levels cannot be exact here; use the 'tokens' level"
                )
            block = max(block, first)
    return block


class _RowAttention:
    """The attention core of one forward: stores each layer's new keys and values in the pools,
    then attends each row on its own against its sequence's keys up to its position."""

    def __init__(self, geometry: BackboneGeometry, spans: list[_Span],
                 sequences: list[RowSequence], pools: list[PoolWrites[KVPool]]) -> None:
        self._geometry = geometry
        self._spans = spans
        self._sequences = sequences
        self._pools = pools

    def __call__(self, index: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        for writes in self._pools:
            keys = k[writes.rows]  # [R, kv_heads, head_dim]
            writes.pool.buffer[index, 0, writes.slots, :, writes.positions] = keys
            writes.pool.buffer[index, 1, writes.slots, :, writes.positions] = v[writes.rows]
        geometry = self._geometry
        out = torch.zeros(q.shape[0], geometry.heads, geometry.head_dim, dtype=q.dtype,
                          device=q.device)  # [N, heads, head_dim]
        with _single_thread():
            self._attend(index, q, out)
        return out

    def _attend(self, index: int, q: torch.Tensor, out: torch.Tensor) -> None:
        # NOTE: the query heads sharing one KV head go in as that head's query rows (no mask), so
        # no call copies keys or values for grouped-query attention.
        geometry = self._geometry
        kv_heads, head_dim = geometry.kv_heads, geometry.head_dim
        queries = q.reshape(-1, 1, kv_heads, geometry.groups, head_dim)  # [N, 1, Hkv, G, D]
        rows = out.view(-1, kv_heads, geometry.groups, head_dim)  # [N, Hkv, G, D]
        # (row, its keys [1, kv_heads, capacity, head_dim], its values, its key count)
        work: list[tuple[int, torch.Tensor, torch.Tensor, int]] = []
        for span in self._spans:
            sequence = self._sequences[span.sequence]
            held = sequence.pool.buffer[index, :, sequence.slot]  # [2, kv_heads, cap, head_dim]
            keys, values = held[0:1], held[1:2]  # [1, kv_heads, capacity, head_dim]
            work += [(j, keys, values, span.position + 1 + j - span.rows.start)
                     for j in range(span.rows.start, span.rows.stop)]

        def attend(part: _Part) -> None:
            # one call per row; the rows are written once at the end (fewer small ops per
            # row: the calls of the two threads share Python's lock between them)
            per_row = queries.unbind(0)
            results = [F.scaled_dot_product_attention(
                per_row[j], keys[:, :, :length], values[:, :, :length], scale=geometry.scale)
                for j, keys, values, length in part]  # each [1, kv_heads, groups, head_dim]
            rows[[j for j, *_ in part]] = torch.cat(results)

        if len(work) < 2 or sum(length for *_, length in work) < PARALLEL_ATTENTION_KEYS:
            attend(work)
            return
        # every call keeps its shape and its one thread, so its bits; only which OS thread runs
        # it changes (rows alternate so the two halves hold about the same key counts)
        helper = _attention_helper().submit(_on_one_thread, attend, work[1::2])
        attend(work[0::2])
        helper.result()


class RowForward:
    """The row-invariant forward of one ``CausalLM`` (see the module docstring)."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.backbone = backbone_for(model)
        self.geometry = self.backbone.geometry
        self.max_positions = self.geometry.max_positions
        with torch.inference_mode():
            positions = torch.arange(self.max_positions, device=model.device)  # [P]
            self._cos, self._sin = self.backbone.rotary(positions)  # [P, rotary_dim] each
        self._start_rows: dict[int, npt.NDArray[np.float32]] = {}
        self.row_block = calibrate_row_block(model)
        # Forwards this engine has run, counting a start row served from its cache as one: the
        # schedule's logical cost, the same whether or not the row was computed before.
        self.forwards = 0

    def start_row(self, token: int) -> npt.NDArray[np.float32]:
        """The row after ``token`` alone at position 0 (the start token), computed once.

        Row invariance makes the cached row equal to any recomputation.
        """
        row = self._start_rows.get(token)
        if row is None:
            row = self.forward([(self.new_sequence(), [token])])[0][0]
            row.setflags(write=False)
            self._start_rows[token] = row
        else:
            self.forwards += 1
        return row

    def new_sequence(self, kv: torch.Tensor | None = None) -> RowSequence:
        """An empty sequence, or one holding ``kv`` ``[layers, 2, kv_heads, tokens, head_dim]``."""
        model = self.model
        geometry = self.geometry
        length = 0 if kv is None else int(kv.shape[3])
        pool = KVPool(1, max(_INITIAL_CAPACITY, length), geometry.layers, geometry.kv_heads,
                      geometry.head_dim, model.dtype, model.device)
        if kv is not None and length > 0:
            pool.buffer[:, :, 0, :, :length] = kv.to(model.device, model.dtype)
        return RowSequence(pool, 0, length)

    def recompute(self, ids: Sequence[int], start_kv: torch.Tensor | None = None) -> torch.Tensor:
        """The KV ``[layers, 2, kv_heads, P + len(ids), head_dim]`` (float32, CPU) of a sequence
        holding ``start_kv`` (``P`` positions; none: empty) after forwarding ``ids``.

        Runs ``ids`` in forwards of ``RECOMPUTE_CHUNK_ROWS`` rows; by row invariance the result
        equals, bit for bit, what stepping the same ids one by one leaves.
        """
        sequence = self.new_sequence(start_kv)
        tokens = [int(t) for t in ids]
        for start in range(0, len(tokens), RECOMPUTE_CHUNK_ROWS):
            # NOTE: no LM head: the KV is complete after the last block, and the head's
            # 49,152 outputs per row would be a sizeable share of a recompute
            self.forward([(sequence, tokens[start : start + RECOMPUTE_CHUNK_ROWS])],
                         logits=False)
        return sequence.kv().to("cpu", torch.float32)

    @torch.inference_mode()
    def forward(
        self, calls: Sequence[tuple[RowSequence, Sequence[int]]], logits: bool = True
    ) -> list[npt.NDArray[np.float32]]:
        """Append each sequence's ids in one forward; return their logit rows ``[len(ids), V]``.

        A sequence may appear once per call. Row ``j`` of a sequence is its next-token
        distribution after ``ids[j]``, bit-identical to what any other grouping computes. The
        forward runs on ``ROW_THREADS`` threads whatever the caller's setting. With ``logits``
        False the LM head is skipped (the KV is written all the same) and every row is empty.
        """
        self.forwards += 1
        with _threads(ROW_THREADS):
            return self._forward(calls, logits)

    def _forward(
        self, calls: Sequence[tuple[RowSequence, Sequence[int]]], logits: bool = True
    ) -> list[npt.NDArray[np.float32]]:
        spans: list[_Span] = []
        ids: list[int] = []
        positions_list: list[int] = []
        require_distinct(sequence for sequence, _ in calls)
        for index, (sequence, chunk) in enumerate(calls):
            if not chunk:
                continue
            end = sequence.length + len(chunk)
            if end > self.max_positions:
                raise InvalidTokensError(
                    f"a sequence of {end} tokens exceeds the model's {self.max_positions} "
                    "positions"
                )
            sequence.reserve(end)
            spans.append(_Span(index, slice(len(ids), len(ids) + len(chunk)), sequence.length))
            positions_list.extend(range(sequence.length, end))
            ids.extend(int(t) for t in chunk)
        if not spans:
            return [np.zeros((0, self.model.vocab_size), dtype=np.float32) for _ in calls]
        count = len(ids)
        padded = max(count, self.row_block)
        device = self.model.device
        token_ids = torch.zeros(padded, dtype=torch.long, device=device)
        token_ids[:count] = torch.tensor(ids, dtype=torch.long, device=device)
        positions = torch.zeros(padded, dtype=torch.long, device=device)
        positions[:count] = torch.tensor(positions_list, device=device)
        sequences = [sequence for sequence, _ in calls]
        attend = _RowAttention(self.geometry, spans, sequences,
                               _pool_writes(spans, sequences, device))
        backbone = self.backbone
        hidden = backbone.embed(token_ids)  # [N, hidden]
        cos, sin = self._cos[positions], self._sin[positions]  # [N, rotary_dim]
        for index in range(self.geometry.layers):
            hidden = backbone.block(index, hidden, cos, sin, attend)
        rows: npt.NDArray[np.float32] = (
            backbone.head(hidden)[:count].float().cpu().numpy() if logits
            else np.zeros((count, 0), dtype=np.float32))
        return finish_call(calls, rows)


def row_forward(model: CausalLM) -> RowForward:
    """The model's row-invariant forward, built once per model and kept with it (its
    calibration and rotary tables are computed once)."""
    return model.derived(RowForward, RowForward)


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """Run the block on ``count`` intra-op threads, restoring torch's setting afterwards."""
    previous = torch.get_num_threads()
    if previous == count:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _attention_helper() -> ThreadPoolExecutor:
    """The one helper thread that runs half of a long forward's per-row attention calls (one per
    process: a forked child has no thread behind its parent's executor, so it makes its own)."""
    global _ATTENTION_HELPER
    if _ATTENTION_HELPER is None or _ATTENTION_HELPER[0] != os.getpid():
        _ATTENTION_HELPER = (os.getpid(), ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="seqkv-row-attention"))
    return _ATTENTION_HELPER[1]


_ATTENTION_HELPER: tuple[int, ThreadPoolExecutor] | None = None


def _on_one_thread(work: Callable[[_Part], None], part: _Part) -> None:
    """``work(part)`` in inference mode on one intra-op thread: torch's thread count is a
    per-thread OpenMP setting, so the helper sets its own (the caller's is 1 already)."""
    torch.set_num_threads(1)
    with torch.inference_mode():
        work(part)


def _single_thread() -> AbstractContextManager[None]:
    """Attention on one thread: torch's CPU attention splits long key ranges across threads,
    which changes the reduction order (measured: 2 vs 1 threads differ from 40 keys on)."""
    return _threads(1)


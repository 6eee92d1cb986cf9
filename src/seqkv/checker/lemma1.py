"""Lemma 1 tested where it can fail: is the KV a function of the tokens, on the schedules that
actually occur for a file?

Lemma 1 of arXiv 2604.15356 says KV_i = F_M(t_1..t_i). Theorem 1 rests on it, and so does the
codec: the decoder rebuilds the KV the encoder digested. On a CPU the float model's bits depend
on how rows are grouped (one prefill, token steps, chunks, batches) and on the thread count, so
the float path's F_M is a function of the tokens *and* the schedule; the integer predictor's
(``seqkv.models.integer``) is meant to be a function of the tokens alone. This module runs the
schedules a file meets, for each KV path the product has, and compares their KV:

- the integer predictor's KV planes (the portable levels' coder): the encoder's chunks of 256
  rows against token-by-token steps (a window), chunks of 17 and 64, a batch of two sequences,
  and one thread against two. Every pair must be bit-identical: the gate.
- the float model's KV (what every file stores): one prefill (the ``prefill`` schedule, 2
  threads) against token steps (a window, 1 thread: the ``tokens`` level), chunks of 16 (the
  whole text), a batch of two, one thread, and the same prefill repeated. They are expected to
  differ except the repeat; the max |dKV| of each pair is reported, and the file's residual
  must restore its stored KV digest (the decode's verification), which is the gate here.

Invariants:
1. Every comparison is exact (``torch.equal``; max |difference| for the float report), and
   covers every layer, key and value, head and component of the compared positions (enforced).
2. The model and the predictor are read, never changed (enforced: inference mode; fresh
   sequences and caches per schedule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import DynamicCache

from seqkv.kvcache import batch_row
from seqkv.levels.portable import integer_predictor, integer_threads
from seqkv.models.adapter import CausalLM
from seqkv.models.integer.forward import IntegerForward, IntKVState, IntSequence
from seqkv.schedule import pinned_threads, schedule_threads

KVPath = Literal["integer", "float"]
# NOTE: token-by-token steps cost a forward per token; a window of this many positions is what
# they are compared on (the prefill and chunk schedules cover the whole text).
STEP_WINDOW = 32
ENCODER_CHUNK = 256  # the portable encoder's rows per forward


@dataclass(frozen=True)
class SchedulePair:
    """One comparison: schedule ``a`` against ``b`` over ``positions`` positions of one path."""

    path: KVPath
    a: str
    b: str
    positions: int
    max_abs_difference: float  # float path: max |KV_a - KV_b|; integer path: 0 or 1 (differ)
    identical: bool


@dataclass(frozen=True)
class Lemma1:
    """Both paths' comparisons, and whether the file's residual restored its KV digest."""

    integer: tuple[SchedulePair, ...]  # empty when the level is not a portable one
    float_kv: tuple[SchedulePair, ...]
    residual_bits_per_token: float
    digest_restored: bool

    @property
    def integer_holds(self) -> bool:
        return all(pair.identical for pair in self.integer)


def _integer_state(engine: IntegerForward, tokens: Sequence[int], chunk: int,
                   threads: int) -> IntKVState:
    sequence = engine.new_sequence()
    with pinned_threads(threads):
        for start in range(0, len(tokens), chunk):
            engine.forward([(sequence, tokens[start : start + chunk])])
    return sequence.state()


def _integer_batched(engine: IntegerForward, tokens: Sequence[int], other: Sequence[int],
                     threads: int) -> IntKVState:
    """``tokens`` forwarded beside ``other`` in the same calls (two slots of one pool)."""
    first, second = engine.new_batch(2)
    with pinned_threads(threads):
        for start in range(0, len(tokens), ENCODER_CHUNK):
            calls: list[tuple[IntSequence, Sequence[int]]] = [
                (first, tokens[start : start + ENCODER_CHUNK])]
            piece = other[start : start + ENCODER_CHUNK]
            if piece:
                calls.append((second, piece))
            engine.forward(calls)
    return first.state()


def _threads(count: int) -> str:
    return f"{count} thread" if count == 1 else f"{count} threads"


def _same(a: IntKVState, b: IntKVState, positions: int) -> bool:
    return (torch.equal(a.planes[:, :, :positions], b.planes[:, :, :positions])
            and torch.equal(a.shifts[:, :, :positions], b.shifts[:, :, :positions]))


def integer_schedules(model: CausalLM, tokens: Sequence[int],
                      window: int = STEP_WINDOW) -> tuple[SchedulePair, ...]:
    """The integer predictor's KV planes on every schedule against the encoder's."""
    engine = integer_predictor(model)
    start = model.start_token_id
    ids = list(tokens) if start is None else [start, *tokens]
    threads = integer_threads(engine)
    reference = _integer_state(engine, ids, ENCODER_CHUNK, threads)
    steps = min(window, len(ids))
    others: list[tuple[str, int, Callable[[], IntKVState]]] = [
        ("token steps", steps, lambda: _integer_state(engine, ids[:steps], 1, threads)),
        ("chunks of 17", len(ids), lambda: _integer_state(engine, ids, 17, threads)),
        ("chunks of 64", len(ids), lambda: _integer_state(engine, ids, 64, threads)),
        ("batch of 2", len(ids),
         lambda: _integer_batched(engine, ids, list(reversed(ids)), threads)),
        (_threads(3 - threads), len(ids),
         lambda: _integer_state(engine, ids, ENCODER_CHUNK, 3 - threads)),
    ]
    pairs = []
    for name, positions, run in others:
        same = _same(reference, run(), positions)
        pairs.append(SchedulePair("integer", f"chunks of {ENCODER_CHUNK}, {_threads(threads)}",
                                  name, positions, 0.0 if same else 1.0, same))
    return tuple(pairs)


@torch.inference_mode()
def _prefill(model: CausalLM, tokens: Sequence[int], threads: int, chunk: int | None = None,
             batch: int = 1) -> torch.Tensor:
    """The float KV ``[L, 2, H, T, D]`` of one forward over ``tokens`` (in ``chunk``s, or as
    row 0 of a batch of ``batch`` copies)."""
    ids = torch.tensor([list(tokens)] * batch, device=model.device)  # [B, T]
    cache = DynamicCache()
    with pinned_threads(threads):
        step = chunk or len(tokens)
        for start in range(0, len(tokens), step):
            model.model(input_ids=ids[:, start : start + step], cache=cache, use_cache=True,
                        logits_to_keep=1)
    if batch == 1:
        return model.kv_tensor(cache)
    return batch_row(cache, 0)


def float_schedules(model: CausalLM, tokens: Sequence[int], prefill_kv: torch.Tensor,
                    window: int = STEP_WINDOW) -> tuple[SchedulePair, ...]:
    """The float model's KV on every schedule against one prefill (``prefill_kv``)."""
    threads = schedule_threads("prefill")
    steps = min(window, len(tokens))
    runs: list[tuple[str, int, Callable[[], torch.Tensor]]] = [
        ("the same prefill again", len(tokens), lambda: _prefill(model, tokens, threads)),
        ("token steps, 1 thread", steps, lambda: model.stepped_kv(tokens[:steps])),
        ("chunks of 16", len(tokens), lambda: _prefill(model, tokens, threads, chunk=16)),
        ("batch of 2", len(tokens), lambda: _prefill(model, tokens, threads, batch=2)),
        ("1 thread", len(tokens), lambda: _prefill(model, tokens, 1)),
    ]
    pairs = []
    for name, positions, run in runs:
        other = run()
        difference = float((other[:, :, :, :positions]
                            - prefill_kv[:, :, :, :positions]).abs().max())
        pairs.append(SchedulePair("float", f"one prefill, {threads} threads", name, positions,
                                  difference, difference == 0.0))
    return tuple(pairs)

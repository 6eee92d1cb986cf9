"""Lemma 1 tested where it can fail: is the KV a function of the tokens, on the schedules that
actually occur for a file?

Lemma 1 of arXiv 2604.15356 says KV_i = F_M(t_1..t_i). Theorem 1 rests on it, and so does the
codec: the decoder rebuilds the KV the encoder digested. On a CPU the float model's bits depend
on how rows are grouped (one prefill, token steps, chunks, batches) and on the thread count, so
the float path's F_M is a function of the tokens *and* the schedule; the integer predictor's
(``seqkv.models.integer``) is meant to be a function of the tokens alone. This module runs the
schedules a file meets, for each KV path the product has, and compares their KV:

- the integer predictor's KV planes (the portable levels' coder). On the whole text: the
  encoder's chunks of 256 rows (2 threads) against the file's decode (token steps, drafted
  chunks, on the thread counts its policy chose), compared by their digests
  (``CompressStats.predictor_digest`` and ``DecompressStats.predictor_digest``), which cost one
  hash each and no forward. On a window (the first ``CHUNK_WINDOW`` positions, the rows of the
  encoder's first forward): token steps (``STEP_WINDOW`` positions), chunks of 17 and 64, a batch
  of two sequences, and the other thread count, each against the encoder's first chunk. Every
  pair must be bit-identical: the gate.
- the float model's KV (what every file stores): one prefill (the ``prefill`` schedule, 2
  threads) against the same prefill repeated and chunks of 64 (the whole text), token steps
  (``STEP_WINDOW`` positions, 1 thread: the ``tokens`` level), a batch of two and one thread
  (the first ``CHUNK_WINDOW`` positions). The schedule the file's level decodes on (the repeat
  for the portable levels, token steps for ``tokens``) covers the whole text, from the KV its
  encoder computed on it, at no extra forward. They are expected to differ except the repeat; the
  max |dKV| of each pair is reported, and the file's residual must restore its stored KV digest
  (the decode's verification), which is the gate here.

Why windows: each whole-text schedule costs a pass over the text, and ``seqkv check`` must cost
at most a verified ``compress`` plus 8 float prefills; the schedules a file actually
meets run on the whole text (the encoder and the decoder, the restore's prefill), the others
on a stated window, which a batch- or thread-dependent forward fails from its first rows.

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

from seqkv.kvcache import batch_row, with_cache
from seqkv.levels.portable import integer_predictor, integer_threads
from seqkv.models.adapter import CausalLM
from seqkv.models.integer.forward import IntegerForward, IntKVState, IntSequence
from seqkv.schedule import pinned_threads, schedule_threads

KVPath = Literal["integer", "float"]
# NOTE: token-by-token steps cost a forward per token; a window of this many positions is what
# they are compared on.
STEP_WINDOW = 32
ENCODER_CHUNK = 256  # the portable encoder's rows per forward
# The positions the other windowed schedules cover: the rows of the encoder's first forward.
CHUNK_WINDOW = ENCODER_CHUNK
DECODER = "decoder steps and drafts"  # the whole-text integer pair's schedule


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


def integer_schedules(model: CausalLM, tokens: Sequence[int], encoder_digest: str | None,
                      decoder_digest: str | None, window: int = STEP_WINDOW
                      ) -> tuple[SchedulePair, ...]:
    """The integer predictor's KV planes: the file's decode against its encoder on the whole
    text (by digest; no pair where either side ran no integer predictor), then every other
    schedule against the encoder's first chunk on a window."""
    engine = integer_predictor(model)
    start = model.start_token_id
    ids = list(tokens) if start is None else [start, *tokens]
    threads = integer_threads(engine)
    reference_name = f"chunks of {ENCODER_CHUNK}, {_threads(threads)}"
    pairs = []
    if encoder_digest is not None and decoder_digest is not None:
        same = encoder_digest == decoder_digest
        pairs.append(SchedulePair("integer", f"the encoder's {reference_name}", DECODER,
                                  len(tokens) - 1, 0.0 if same else 1.0, same))
    head = ids[:CHUNK_WINDOW]
    reference = _integer_state(engine, head, ENCODER_CHUNK, threads)
    steps = min(window, len(head))
    others: list[tuple[str, int, Callable[[], IntKVState]]] = [
        ("token steps", steps, lambda: _integer_state(engine, head[:steps], 1, threads)),
        ("chunks of 17", len(head), lambda: _integer_state(engine, head, 17, threads)),
        ("chunks of 64", len(head), lambda: _integer_state(engine, head, 64, threads)),
        ("batch of 2", len(head),
         lambda: _integer_batched(engine, head, list(reversed(head)), threads)),
        (_threads(3 - threads), len(head),
         lambda: _integer_state(engine, head, ENCODER_CHUNK, 3 - threads)),
    ]
    for name, positions, run in others:
        same = _same(reference, run(), positions)
        pairs.append(SchedulePair("integer", reference_name, name, positions,
                                  0.0 if same else 1.0, same))
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
            model.model(input_ids=ids[:, start : start + step], **with_cache(model.model, cache),
                        use_cache=True, logits_to_keep=1)
    if batch == 1:
        return model.kv_tensor(cache)
    return batch_row(cache, 0)


# The float schedule a level's decoder rebuilds the KV on, by the level's ``LevelSpec.schedule``,
# named as in ``float_schedules``: the encoder computed that KV over the whole text already.
REBUILT_SCHEDULES = {"prefill": "the same prefill again", "token-by-token": "token steps, 1 thread"}


def float_schedules(model: CausalLM, tokens: Sequence[int], prefill_kv: torch.Tensor,
                    window: int = STEP_WINDOW,
                    rebuilt: tuple[str, torch.Tensor] | None = None
                    ) -> tuple[SchedulePair, ...]:
    """The float model's KV on every schedule against one prefill (``prefill_kv``): the repeat
    and chunks on the whole text, the rest on windows (module docstring). ``rebuilt``: the
    level's decode schedule (``REBUILT_SCHEDULES``) and the KV the encoder computed on it for
    the whole text (what the decoder rebuilds), used for that schedule on the whole text instead
    of running it again."""
    threads = schedule_threads("prefill")
    steps = min(window, len(tokens))
    head = list(tokens[:CHUNK_WINDOW])
    runs: list[tuple[str, int, Callable[[], torch.Tensor]]] = [
        ("the same prefill again", len(tokens), lambda: _prefill(model, tokens, threads)),
        ("token steps, 1 thread", steps, lambda: model.stepped_kv(tokens[:steps])),
        # NOTE: 64-row chunks, not 16: each float32 forward streams the 540 MB of weights, 68 GB
        # for 125 chunks of 16 over 1,987 tokens against 17 GB for 31 of 64
        # (benchmarks/check_cost.py measures the schedules' share of a check)
        ("chunks of 64", len(tokens), lambda: _prefill(model, tokens, threads, chunk=64)),
        ("batch of 2", len(head), lambda: _prefill(model, head, threads, batch=2)),
        ("1 thread", len(head), lambda: _prefill(model, head, 1)),
    ]
    pairs = []
    for name, positions, run in runs:
        if rebuilt is not None and rebuilt[0] == name:
            positions, other = len(tokens), rebuilt[1]
        else:
            other = run()
        difference = float((other[:, :, :, :positions]
                            - prefill_kv[:, :, :, :positions]).abs().max())
        pairs.append(SchedulePair("float", f"one prefill, {threads} threads", name, positions,
                                  difference, difference == 0.0))
    return tuple(pairs)

"""Chunk forwards on a ``DynamicCache``: the one primitive every decoding schedule is built from.

A *forward* appends ``len(ids)`` positions to a cache and returns one logit row per position; row
``j`` is the model's next-token distribution after ``ids[j]``. Every schedule in
``seqkv.decoding`` (token-by-token, replayed speculation, blocked verification) is a sequence of
these calls plus ``crop_to``, so two runs that issue the same calls on the same cache state get
the same bits.

Invariants:
1. ``forward_rows`` with one id is the exact call ``seqkv.models.Stepper.step`` makes, so a
   schedule of single-id forwards reproduces the codec's probabilities bit for bit (checked by
   ``tests/test_decoding_speculative.py``).
2. ``forward_rows`` mutates only ``cache`` (it appends); ``crop_to`` only shortens it
   (enforced).
3. A forward is deterministic given the cache's bits, the ids and the shape of the call, on one
   execution profile (assumed, as in ``seqkv.schedule``; measured by ``research.decoding.probes``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache, PreTrainedModel

from seqkv.coding.frequencies import (
    CumulativeTable,
    table_and_log2p,
    uniform_distribution,
)
from seqkv.models.adapter import CausalLM, Stepper

LogitRows = npt.NDArray[np.float32]  # [positions, vocab]


@torch.inference_mode()
def forward_rows(model: PreTrainedModel, cache: DynamicCache, ids: Sequence[int]) -> LogitRows:
    """Append ``ids`` to ``cache`` in one forward; return their logit rows ``[len(ids), V]``."""
    if len(ids) == 0:
        raise ValueError("a forward needs at least one position: the token list is empty")
    x = torch.tensor([list(ids)], dtype=torch.long, device=model.device)  # [1, L]
    output = model(input_ids=x, cache=cache, use_cache=True)
    rows: LogitRows = output.logits[0].float().cpu().numpy()  # [L, V]
    return rows


def cache_length(cache: DynamicCache) -> int:
    """Number of positions the cache holds."""
    return int(cache.get_seq_length())


def crop_to(cache: DynamicCache, length: int) -> None:
    """Drop every position at or after ``length`` (a no-op when the cache is not longer)."""
    excess = cache_length(cache) - length
    assert length >= 0
    if excess > 0:
        # NOTE: transformers 5 takes the number of positions to remove, as a negative integer.
        cache.crop(-excess)


def first_token_distribution(
    model: CausalLM, context: int | None
) -> tuple[CumulativeTable, npt.NDArray[np.float64]]:
    """The table and log2-probabilities position 0 is coded under: after ``context``, or uniform.

    Same convention as ``seqkv.codec``: the start token runs on its own throwaway cache, so the
    session's cache holds the coded tokens only, from position 0.
    """
    if context is None:
        return uniform_distribution(model.vocab_size)
    row = Stepper(model.model).step(context)
    return table_and_log2p(row)


def greedy(rows: LogitRows) -> list[int]:
    """Argmax of each row (the first maximum on ties): the model's own greedy guesses."""
    return [int(i) for i in np.argmax(rows, axis=1)]

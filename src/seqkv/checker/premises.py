"""Theorem 1's premises, measured on a model: deterministic inference and injectivity.

Theorem 1 (``seqkv.proofs.theorem1``) rests on two premises. This module measures both; it reads
the model and never changes it.

- DETERMINISM: the KV and the logits are functions of the tokens. They are, but only per
  computation schedule: we run one text as a full prefill, in chunks of 16, and token by token
  (twice), and report the largest differences. Only the repeat must be exactly zero.
- INJECTIVITY: distinct tokens give distinct first-layer keys and values. We compute K and V of
  layer 0 at position 0 (where the rotary embedding is the identity) for every vocabulary entry,
  with the model's ``Backbone`` (``seqkv.models.backbones``), and report the exact duplicates and
  the minimum pairwise Euclidean distance.

Invariants:
1. Forward passes run under ``torch.inference_mode`` and never mutate weights (enforced).
2. The minimum distance is exact up to float64 recomputation of the closest candidate pairs; the
   candidates come from a float32 all-pairs search (checked against brute force on a tiny model).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from seqkv.errors import InsufficientSamplesError, InvalidTokensError
from seqkv.models.adapter import CausalLM
from seqkv.models.backbones import backbone_for
from seqkv.schedule import pinned_threads

_CHUNK = 16
_CANDIDATES = 16


@dataclass(frozen=True)
class DeterminismMeasurement:
    """Largest absolute differences between schedules over the same tokens."""

    tokens: int
    repeat_logits: float
    prefill_vs_steps_logits: float
    chunked_vs_steps_logits: float
    prefill_vs_steps_kv: float


@dataclass(frozen=True)
class InjectivityMeasurement:
    """First-layer [K | V] at position 0 over the whole vocabulary.

    ``collisions`` lists groups of token ids that share one [K | V] row exactly. When there are
    any, ``min_distance`` is 0 and ``closest_pair`` is the first collision; the all-pairs search
    (about a minute for a 49,152-token vocabulary on 2 cores) runs only when there are none.
    """

    vocab: int
    dims: int
    collisions: tuple[tuple[int, ...], ...]
    min_distance: float
    closest_pair: tuple[int, int]

    @property
    def injective(self) -> bool:
        return not self.collisions


@torch.inference_mode()
def measure_determinism(model: CausalLM, tokens: list[int]) -> DeterminismMeasurement:
    """Run ``tokens`` under four schedules and compare logits and KV."""
    if len(tokens) < 2:
        raise InvalidTokensError("the determinism check needs at least 2 tokens")

    def steps() -> tuple[torch.Tensor, torch.Tensor]:
        stepper = model.new_stepper()
        with pinned_threads():
            logits = torch.stack([torch.from_numpy(stepper.step(t)) for t in tokens])  # [T, V]
        return logits, model.kv_tensor(stepper.cache)

    first, kv_steps = steps()
    second, _ = steps()
    ids = torch.tensor([tokens], device=model.device)  # [1, T]
    prefill_cache = DynamicCache()
    prefill = model.model(input_ids=ids, cache=prefill_cache).logits[0].float().cpu()  # [T, V]
    chunk_cache = DynamicCache()
    chunked = torch.cat([
        model.model(input_ids=ids[:, i : i + _CHUNK], cache=chunk_cache).logits[0].float().cpu()
        for i in range(0, len(tokens), _CHUNK)
    ])  # [T, V]
    return DeterminismMeasurement(
        tokens=len(tokens),
        repeat_logits=float((first - second).abs().max()),
        prefill_vs_steps_logits=float((prefill - first).abs().max()),
        chunked_vs_steps_logits=float((chunked - first).abs().max()),
        prefill_vs_steps_kv=float((model.kv_tensor(prefill_cache) - kv_steps).abs().max()),
    )


@torch.inference_mode()
def first_layer_kv(model: CausalLM) -> torch.Tensor:
    """[K | V] of layer 0 at position 0 for every token id: ``[vocab, 2 * kv_heads * head_dim]``.

    Computed by the model's ``Backbone`` (``UnsupportedModelError`` for an architecture without
    one).
    """
    ids = torch.arange(model.vocab_size, device=model.device)  # [V]
    kv = backbone_for(model).first_layer_kv(ids)  # [V, 2, kv_heads, head_dim]
    return kv.reshape(model.vocab_size, -1).float().cpu()


def min_pairwise_distance(rows: torch.Tensor, chunk: int = 2048) -> tuple[float, tuple[int, int]]:
    """Smallest Euclidean distance between two distinct rows, and the pair that has it."""
    if rows.shape[0] < 2:
        raise InsufficientSamplesError("a pairwise distance needs at least 2 rows")
    squared = (rows * rows).sum(dim=1)  # [N]
    candidates: list[tuple[float, int, int]] = []
    for start in range(0, rows.shape[0], chunk):
        block = rows[start : start + chunk]  # [C, dims]
        d2 = squared[start : start + chunk, None] + squared[None, :] - 2 * block @ rows.T
        index = torch.arange(block.shape[0])
        d2[index, start + index] = float("inf")  # a row against itself
        d2[:, : start] = float("inf")  # each pair once: j > i
        d2[index[:, None] >= (torch.arange(rows.shape[0])[None, :] - start)] = float("inf")
        flat = d2.reshape(-1)
        k = min(_CANDIDATES, flat.numel())
        values, where = torch.topk(flat, k, largest=False)
        for value, position in zip(values.tolist(), where.tolist(), strict=True):
            if np.isfinite(value):
                i, j = divmod(position, rows.shape[0])
                candidates.append((value, start + i, j))
    exact = rows.double()
    best = min(
        ((float((exact[i] - exact[j]).norm()), (i, j)) for _, i, j in candidates),
        key=lambda item: item[0],
    )
    return best


def measure_injectivity(model: CausalLM) -> InjectivityMeasurement:
    rows = first_layer_kv(model)
    _, inverse, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
    collisions = tuple(
        tuple(int(i) for i in torch.nonzero(inverse == group).reshape(-1))
        for group in torch.nonzero(counts > 1).reshape(-1)
    )
    if collisions:
        distance, pair = 0.0, (collisions[0][0], collisions[0][1])
    else:
        distance, pair = min_pairwise_distance(rows)
    return InjectivityMeasurement(
        vocab=rows.shape[0],
        dims=rows.shape[1],
        collisions=collisions,
        min_distance=distance,
        closest_pair=pair,
    )

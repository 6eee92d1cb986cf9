"""A model's KV-collision classes: the token ids whose next-position KV is identical.

Theorem 1 of arXiv 2604.15356 bounds H(KV_(i+1) | prefix) by H(t_(i+1) | prefix). Under a fixed
schedule the next position's KV is a function of the next token, so its entropy is the entropy
of the coder's next-token distribution pushed forward through that function: the two differ by
exactly ``sum over classes c of P(c) H(t | c)``, where the classes are the sets of ids whose KV
at that position is identical at every layer. The classes do not depend on the prefix:

- ids with distinct first-layer [K | V] rows at position 0 have distinct KV at every position
  (layer 0's key is that row rotated by an invertible rotation, its value that row), so they
  are never in one class;
- ids whose first-layer rows are equal are split by a real forward after the start token, at
  batch 1 (the coder's schedule), comparing every layer's KV bit for bit. Ids with identical
  embedding rows (SmolLM2-135M: 15 ids in 4 groups, unused or rare) compute identical KV after
  any prefix; the forward confirms each class.

So the gap is computed exactly at every coded position from the distribution the coder already
holds (``seqkv.levels.base.TraceColumns``), with no forward per position.

Invariants:
1. ``collision_classes`` holds every group of two or more ids with bit-identical KV after the
   start token, and nothing else (enforced: candidate groups from exact first-layer equality,
   then split by the forward's KV bytes).
2. The classes are computed once per model (kept on the model object and, by model digest, in
   the description registry's folder); a cached file is used only when its model digest and
   content check out (enforced; a damaged cache is recomputed).
3. Computing reads the model and never changes it (enforced: inference mode).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from seqkv.descriptions import default_root
from seqkv.digests import model_digest
from seqkv.files import write_atomically
from seqkv.kvcache import with_cache
from seqkv.models.adapter import CausalLM
from seqkv.models.backbones import backbone_for
from seqkv.schedule import pinned_threads

CACHE_VERSION = 1


@dataclass(frozen=True)
class CollisionClasses:
    """Groups of two or more token ids whose next-position KV is bit-identical."""

    classes: tuple[tuple[int, ...], ...]
    candidates: int  # ids that shared a first-layer row (before the forward split them)

    @property
    def members(self) -> int:
        return sum(len(c) for c in self.classes)

    def index_arrays(self) -> list[npt.NDArray[np.int64]]:
        return [np.asarray(c, dtype=np.int64) for c in self.classes]


def first_layer_rows(model: CausalLM) -> torch.Tensor:
    """[K | V] of layer 0 at position 0 for every token id: ``[vocab, 2 * kv_heads * head_dim]``
    (computed by the model's ``Backbone``)."""
    ids = torch.arange(model.vocab_size, device=model.device)  # [V]
    with torch.inference_mode():
        kv = backbone_for(model).first_layer_kv(ids)  # [V, 2, kv_heads, head_dim]
    return kv.reshape(model.vocab_size, -1).float().cpu()


def _groups(rows: torch.Tensor) -> list[list[int]]:
    """Ids whose rows are identical, in groups of two or more."""
    _, inverse, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
    return [[int(i) for i in torch.nonzero(inverse == group).reshape(-1)]
            for group in torch.nonzero(counts > 1).reshape(-1)]


@torch.inference_mode()
def _split_by_forward(model: CausalLM, group: list[int]) -> list[tuple[int, ...]]:
    """``group`` split into the ids whose KV after the start token is bit-identical."""
    start = model.start_token_id
    outcomes: dict[bytes, list[int]] = {}
    for token in group:
        cache = DynamicCache()
        ids = [token] if start is None else [start, token]
        with pinned_threads():  # the token-by-token coder's schedule: one thread
            model.model(input_ids=torch.tensor([ids], device=model.device),
                        **with_cache(model.model, cache),
                        use_cache=True)
        kv = model.kv_tensor(cache)[:, :, :, -1]  # [L, 2, H, D]: the token's position
        outcomes.setdefault(kv.contiguous().numpy().tobytes(), []).append(token)
    return [tuple(ids) for ids in outcomes.values() if len(ids) > 1]


def compute_collision_classes(model: CausalLM) -> CollisionClasses:
    """The classes of ``model``, computed (module docstring)."""
    groups = _groups(first_layer_rows(model))
    classes = [c for group in groups for c in _split_by_forward(model, group)]
    return CollisionClasses(tuple(sorted(classes)), sum(len(g) for g in groups))


def _cache_path(model: CausalLM) -> Path:
    return default_root() / "collisions" / f"{model_digest(model.identity).hex()}.json"


def _read_cache(path: Path, vocab: int) -> CollisionClasses | None:
    try:
        raw = json.loads(path.read_text())
        classes = tuple(tuple(int(t) for t in c) for c in raw["classes"])
        valid = (raw["version"] == CACHE_VERSION and all(len(c) > 1 for c in classes)
                 and all(0 <= t < vocab for c in classes for t in c))
        return CollisionClasses(classes, int(raw["candidates"])) if valid else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _load_or_compute(model: CausalLM) -> CollisionClasses:
    path = _cache_path(model)
    cached = _read_cache(path, model.vocab_size)
    if cached is not None:
        return cached
    classes = compute_collision_classes(model)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({"version": CACHE_VERSION, "classes": classes.classes,
                                           "candidates": classes.candidates}).encode())
    except OSError:
        pass  # a read-only cache folder: the classes are recomputed next time
    return classes


def collision_classes(model: CausalLM) -> CollisionClasses:
    """The model's collision classes, computed once (module invariant 2)."""
    return model.derived(CollisionClasses, _load_or_compute)

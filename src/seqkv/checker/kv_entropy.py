"""H(KV_{i+1} | prefix) against H(t_{i+1} | prefix), measured position by position.

Theorem 1 of arXiv 2604.15356 says the next position's KV carries no more information than the
next token: KV_{i+1} = F(prefix, t_{i+1}) is a function of the token given the prefix, so its
entropy is the entropy of the pushforward of the model's next-token distribution, at most
H(t | prefix), with equality when distinct tokens give distinct KV. This module measures both
sides at positions drawn from the data (a Monte-Carlo estimate over prefixes):

- H(t | prefix) exactly, from the model's full next-token distribution (float64 softmax of one
  prefill's logits);
- H(KV | prefix) by merging the tokens whose KV_{i+1} (all layers, keys and values, at the
  stored dtype) is identical, bit for bit. Candidates for merging are found cheaply over the whole
  vocabulary: tokens with identical first-layer [K | V] rows (identical embedding rows included).
  Every such candidate, and the ``top_k`` most probable tokens, is stepped on the prefix's KV;
  their KV_{i+1} are compared byte for byte. Every tested candidate is stepped twice: a
  candidate whose KV differs between the two runs makes the KV a random function of the token
  (Lemma 1 fails), and its mass is split over the two outcomes, so the measured H(KV) exceeds
  H(t) and the bound fails.

Invariants:
1. The measurement reads the model; it never changes it (enforced: inference mode, no writes).
2. H(KV) = H(t) - sum over merged groups of P(g) H(t | g) + sum over nondeterministic
   candidates of p(c) * log2(distinct outcomes): the entropy of the pushforward over the atoms
   found (enforced; checked against a hand computation on a model with tied embedding rows).
3. A token outside the tested candidates is assumed distinct from every other: its first-layer
   [K | V] row differs from every other token's, and layer 0's value row at position i + 1 is a
   function of the token alone (assumed; the untested mass is reported).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from seqkv.checker.estimators import Interval, mean_interval
from seqkv.checker.premises import first_layer_kv
from seqkv.errors import InvalidTokensError
from seqkv.kvcache import cache_from_tensor
from seqkv.models.adapter import CausalLM

# NOTE: 32 candidates carry most of the next-token mass on text (measured on the sample with
# SmolLM2-135M: 0.93 on average); stepping them costs four batched steps of 8 rows per run.
DEFAULT_TOP_K = 32
# NOTE: 32 positions drawn from the data give a t-interval on the mean gap; a few minutes at most
# on a 2-core CPU for a 600-token text with SmolLM2-135M.
DEFAULT_POSITIONS = 32
_BATCH = 8


@dataclass(frozen=True)
class PositionEntropy:
    """Both entropies after one prefix of the data (prefix length ``position``)."""

    position: int
    token_entropy: float  # H(t_{i+1} | prefix), bits
    kv_entropy: float  # H(KV_{i+1} | prefix), bits
    merged: tuple[tuple[int, ...], ...]  # tested candidates whose KV_{i+1} were identical
    nondeterministic: tuple[int, ...]  # candidates whose KV_{i+1} differed between two runs
    tested_mass: float  # probability of the tested candidates

    @property
    def gap(self) -> float:
        """H(t | prefix) - H(KV | prefix): >= 0 under Theorem 1, 0 under injectivity."""
        return self.token_entropy - self.kv_entropy


@dataclass(frozen=True)
class KVEntropyEstimate:
    positions: tuple[PositionEntropy, ...]
    top_k: int
    collision_groups: tuple[tuple[int, ...], ...]  # identical first-layer [K | V] rows
    token_entropy: Interval  # mean over positions
    kv_entropy: Interval
    gap: Interval

    @property
    def deterministic(self) -> bool:
        return not any(p.nondeterministic for p in self.positions)

    @property
    def min_gap(self) -> float:
        return min(p.gap for p in self.positions)

    @property
    def mean_tested_mass(self) -> float:
        return float(np.mean([p.tested_mass for p in self.positions]))


def collision_groups(model: CausalLM) -> tuple[tuple[int, ...], ...]:
    """Groups of token ids whose first-layer [K | V] rows at position 0 are identical."""
    rows = first_layer_kv(model)  # [V, 2 * kv_heads * head_dim]
    _, inverse, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
    return tuple(
        tuple(int(i) for i in torch.nonzero(inverse == group).reshape(-1))
        for group in torch.nonzero(counts > 1).reshape(-1)
    )


@torch.inference_mode()
def next_position_kv(model: CausalLM, prefix_kv: torch.Tensor,
                     candidates: list[int]) -> list[bytes]:
    """The bytes of KV_{i+1} (every layer's keys and values at the new position, at the model's
    dtype) for each candidate next token, after the prefix whose KV is ``prefix_kv``."""
    out: list[bytes] = []
    for start in range(0, len(candidates), _BATCH):
        chunk = candidates[start : start + _BATCH]
        cache = cache_from_tensor(prefix_kv.to(model.device, model.dtype), len(chunk))
        ids = torch.tensor(chunk, device=model.device)[:, None]  # [B, 1]
        model.model(input_ids=ids, cache=cache, use_cache=True)
        per_layer = []
        for layer in cache.layers:
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            assert isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)
            per_layer.append(torch.stack([keys[:, :, -1], values[:, :, -1]], dim=1))  # [B,2,H,D]
        stacked = torch.stack(per_layer, dim=1).cpu().contiguous()  # [B, L, 2, H, D]
        out += [stacked[b].numpy().tobytes() for b in range(len(chunk))]
    return out


def _entropy_bits(p: npt.NDArray[np.float64]) -> float:
    q = p[p > 0]
    return float(-(q * np.log2(q)).sum())


def position_entropy(position: int, log2p: npt.NDArray[np.float64], prefix_kv: torch.Tensor,
                     model: CausalLM, groups: tuple[tuple[int, ...], ...],
                     top_k: int) -> PositionEntropy:
    """Both entropies after the prefix of length ``position`` (distribution ``2**log2p``)."""
    p = np.exp2(log2p)
    token_entropy = _entropy_bits(p)
    members = {t for group in groups for t in group}
    top = np.argsort(-p, kind="stable")[:top_k]
    candidates = sorted(members | {int(t) for t in top})
    first = next_position_kv(model, prefix_kv, candidates)
    second = next_position_kv(model, prefix_kv, candidates)
    nondeterministic = tuple(c for c, a, b in zip(candidates, first, second, strict=True)
                             if a != b)
    outcomes: dict[bytes, list[int]] = {}
    for candidate, kv in zip(candidates, first, strict=True):
        if candidate not in nondeterministic:
            outcomes.setdefault(kv, []).append(candidate)
    merged = tuple(tuple(group) for group in outcomes.values() if len(group) > 1)
    kv_entropy = token_entropy
    for group in merged:
        mass = p[list(group)]
        total = float(mass.sum())
        if total > 0:
            # replace the group's atoms by one atom of their total mass
            kv_entropy -= _entropy_bits(mass) - float(-total * np.log2(total))
    for candidate in nondeterministic:
        kv_entropy += float(p[candidate])  # two distinct outcomes of half its mass: +p bits
    return PositionEntropy(position, token_entropy, kv_entropy, merged, nondeterministic,
                           float(p[candidates].sum()))


@torch.inference_mode()
def estimate_kv_entropy(model: CausalLM, tokens: list[int], positions: int = DEFAULT_POSITIONS,
                        top_k: int = DEFAULT_TOP_K, seed: int = 0,
                        confidence: float = 0.95) -> KVEntropyEstimate:
    """Both entropies at ``positions`` prefix lengths drawn uniformly from the data (seeded)."""
    if len(tokens) < 2:
        raise InvalidTokensError("the KV entropy estimate needs at least 2 tokens")
    ids = torch.tensor([tokens], device=model.device)  # [1, T]
    cache = DynamicCache()
    logits = model.model(input_ids=ids, cache=cache, use_cache=True).logits[0]  # [T, V]
    log2p = (torch.log_softmax(logits.double().cpu(), dim=-1) / np.log(2.0)).numpy()
    kv = model.kv_tensor(cache)  # [L, 2, H, T, D]
    count = min(positions, len(tokens))
    rng = np.random.default_rng(seed)
    chosen = sorted(int(i) for i in rng.choice(np.arange(1, len(tokens) + 1), size=count,
                                               replace=False))
    groups = collision_groups(model)
    rows = tuple(position_entropy(i, log2p[i - 1], kv[:, :, :, :i], model, groups, top_k)
                 for i in chosen)
    token = np.array([r.token_entropy for r in rows])
    kv_bits = np.array([r.kv_entropy for r in rows])
    return KVEntropyEstimate(
        positions=rows, top_k=top_k, collision_groups=groups,
        token_entropy=_interval(token, confidence), kv_entropy=_interval(kv_bits, confidence),
        gap=_interval(token - kv_bits, confidence),
    )


def _interval(values: npt.NDArray[np.float64], confidence: float) -> Interval:
    if values.size < 2:
        value = float(values.mean())
        return Interval(value, value, value, confidence, "one position: no interval")
    return mean_interval(values, confidence, batches=min(values.size, 20))

"""Distortion of a decoded KV cache: KV error, attention-output error, and what the model does
when it continues from it.

Motivation: a KV codec is only as good as the model's behaviour on the decoded cache. Mean
squared error on KV components is the quantizers' figure of merit; attention outputs are what
the cache feeds; the next-token distribution over a held-out continuation is what a user sees.

Definitions (``C`` continuation tokens follow the ``T`` cached positions):
- KV MSE: mean over all components of ``(KV_decoded - KV)^2``; KV NMSE divides by the mean of
  ``KV^2``.
- Attention NMSE: for each layer, the real queries of the continuation tokens (computed in a
  forward from the *original* cache, after RoPE) attend over the ``T`` cached positions of the
  original and of the decoded KV; ``||o_dec - o||^2 / ||o||^2`` over heads and queries, averaged
  over layers. The continuation's own keys are left out, so the figure isolates the cache.
  The queries come from transformers' own forward: its hidden states at each layer's input go
  through that layer of the model's ``Backbone`` (``seqkv.models.backbones``), whose ``attend``
  callback keeps the rotated queries.
- Next-token KL: mean over the ``C`` continuation positions of ``KL(P_original || P_decoded)``
  in bits, where each side runs the continuation tokens over its own cache.
- Perplexity: ``exp`` of the mean negative log-likelihood of continuation tokens ``1 .. C-1``
  (token 0 would need logits at the last cached position, which a cache does not hold).

Invariants:
1. The reference side (original cache) is computed once per sweep (``ContinuationReference``)
   and never mutated (enforced: frozen dataclass; caches are rebuilt from tensors per forward).
2. Capturing queries mutates nothing: the forward that gives the log-probabilities also returns
   its hidden states, and the backbone recomputes each layer's queries from them (enforced).
3. The model's architecture has a ``Backbone`` (enforced: ``UnsupportedModelError`` naming the
   model type otherwise); the captured queries reproduce the model's own attention outputs
   (checked on a tiny random model of every backbone family, ``tests/test_delta_metrics.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seqkv.errors import InsufficientSamplesError, InvalidKVError, UnsupportedModelError
from seqkv.kvcache import cache_from_tensor, with_cache
from seqkv.models.adapter import CausalLM
from seqkv.models.backbones import Backbone, backbone_for

__all__ = [
    "ContinuationReference",
    "Distortion",
    "UnsupportedModelError",
    "build_reference",
    "kv_mse",
    "kv_nmse",
    "measure",
]


def kv_mse(original: torch.Tensor, decoded: torch.Tensor) -> float:
    """Mean squared error over all KV components.

    >>> kv_mse(torch.zeros(2, 2), torch.ones(2, 2))
    1.0
    """
    if original.shape != decoded.shape:
        raise InvalidKVError(f"shapes differ: {tuple(original.shape)} vs {tuple(decoded.shape)}")
    return float((decoded.double() - original.double()).square().mean())


def kv_nmse(original: torch.Tensor, decoded: torch.Tensor, mse: float | None = None) -> float:
    """:func:`kv_mse` (or ``mse``, when already computed) divided by the mean squared KV
    component."""
    error = kv_mse(original, decoded) if mse is None else mse
    return error / max(float(original.double().square().mean()), 1e-300)


@dataclass(frozen=True)
class ContinuationReference:
    """The original cache's side of every continuation metric, computed once."""

    original: torch.Tensor
    """``[layers, 2, kv_heads, T, head_dim]``."""
    continuation: tuple[int, ...]
    log_probs: torch.Tensor
    """``[C, vocab]`` float64 natural-log probabilities from the original cache."""
    queries: tuple[torch.Tensor, ...]
    """Per layer ``[query_heads, C, head_dim]`` after RoPE."""
    outputs: tuple[torch.Tensor, ...]
    """Per layer ``[query_heads, C, head_dim]``: attention over the original cached positions."""
    perplexity: float


def _continue(model: CausalLM, kv: torch.Tensor, continuation: Sequence[int]
              ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Log-probabilities ``[C, vocab]`` (float64) of running ``continuation`` over ``kv``, and
    the hidden states at each layer's input (``[1, C, hidden]`` each)."""
    cache = cache_from_tensor(kv.to(model.device, model.dtype))
    ids = torch.tensor([list(continuation)], dtype=torch.long, device=model.device)  # [1, C]
    with torch.inference_mode():
        output = model.model(input_ids=ids, **with_cache(model.model, cache), use_cache=True,
                             output_hidden_states=True)
    hidden = tuple(output.hidden_states[: model.num_layers])
    return torch.log_softmax(output.logits[0].double().cpu(), dim=-1), hidden  # [C, V]


@torch.inference_mode()
def _queries(backbone: Backbone, hidden: Sequence[torch.Tensor],
             positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each layer's rotated queries ``[query_heads, C, head_dim]`` (float32, CPU) from the
    hidden states at its input, through the backbone's block with a capturing ``attend``."""
    cos, sin = backbone.rotary(positions)  # [C, rotary_dim] each
    captured: list[torch.Tensor] = []

    def capture(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        captured.append(q.transpose(0, 1).float().cpu())  # [Hq, C, D]
        return torch.zeros_like(q)  # the block's output is not used

    for index, states in enumerate(hidden):
        backbone.block(index, states[0], cos, sin, capture)  # [C, hidden]
    return tuple(captured)


def _perplexity(log_probs: torch.Tensor, continuation: Sequence[int]) -> float:
    targets = torch.tensor(list(continuation[1:]))
    nll = -log_probs[:-1].gather(1, targets[:, None]).squeeze(1)  # [C - 1]
    return math.exp(float(nll.mean()))


def _attend(query: torch.Tensor, kv_layer: torch.Tensor, groups: int,
            scaling: float) -> torch.Tensor:
    """``softmax(q K^T * scaling) V`` for q ``[Hq, C, D]`` and kv_layer ``[2, H, T, D]``."""
    keys = kv_layer[0].double().repeat_interleave(groups, dim=0)  # [Hq, T, D]
    values = kv_layer[1].double().repeat_interleave(groups, dim=0)  # [Hq, T, D]
    scores = query.double() @ keys.transpose(-1, -2) * scaling  # [Hq, C, T]
    return torch.softmax(scores, dim=-1) @ values  # [Hq, C, D]


def build_reference(model: CausalLM, original: torch.Tensor,
                    continuation: Sequence[int]) -> ContinuationReference:
    """Run ``continuation`` over the original cache once, capturing logits and queries."""
    tokens = [int(t) for t in continuation]
    model.check_tokens(tokens)
    if len(tokens) < 2:
        raise InsufficientSamplesError("the continuation needs at least 2 tokens for a perplexity")
    original = original.detach().to("cpu", torch.float32)
    backbone = backbone_for(model)
    geometry = backbone.geometry
    log_probs, hidden = _continue(model, original, tokens)
    cached = original.shape[3]
    positions = torch.arange(cached, cached + len(tokens), device=model.device)  # [C]
    queries = _queries(backbone, hidden, positions)
    outputs = tuple(_attend(queries[i], original[i], geometry.groups, geometry.scale)
                    for i in range(geometry.layers))
    return ContinuationReference(original, tuple(tokens), log_probs, queries, outputs,
                                 _perplexity(log_probs, tokens))


@dataclass(frozen=True)
class Distortion:
    """Every distortion figure of one decoded cache against the reference."""

    kv_mse: float
    kv_nmse: float
    attention_nmse: float
    kl_bits: float
    """Mean next-token ``KL(P_original || P_decoded)`` over the continuation, in bits."""
    perplexity_original: float
    perplexity_decoded: float

    @property
    def perplexity_change(self) -> float:
        """Relative change: ``ppl_decoded / ppl_original - 1``."""
        return self.perplexity_decoded / self.perplexity_original - 1.0


def measure(model: CausalLM, reference: ContinuationReference,
            decoded: torch.Tensor) -> Distortion:
    """All figures for ``decoded`` (``[layers, 2, kv_heads, T, head_dim]``)."""
    decoded = decoded.detach().to("cpu", torch.float32)
    original = reference.original
    if decoded.shape != original.shape:
        raise InvalidKVError(
            f"decoded KV has shape {tuple(decoded.shape)}, the reference {tuple(original.shape)}"
        )
    geometry = backbone_for(model).geometry
    errors = []
    for i in range(geometry.layers):
        out = _attend(reference.queries[i], decoded[i], geometry.groups, geometry.scale)
        ref = reference.outputs[i]
        errors.append(float((out - ref).square().sum() / ref.square().sum().clamp_min(1e-300)))
    log_probs, _ = _continue(model, decoded, reference.continuation)
    kl_nats = (reference.log_probs.exp() * (reference.log_probs - log_probs)).sum(dim=-1)  # [C]
    mse = kv_mse(original, decoded)
    return Distortion(
        kv_mse=mse,
        kv_nmse=kv_nmse(original, decoded, mse),
        attention_nmse=float(sum(errors) / len(errors)),
        kl_bits=float(kl_nats.mean()) / math.log(2.0),
        perplexity_original=reference.perplexity,
        perplexity_decoded=_perplexity(log_probs, reference.continuation),
    )

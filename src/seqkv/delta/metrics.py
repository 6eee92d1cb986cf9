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
- Next-token KL: mean over the ``C`` continuation positions of ``KL(P_original || P_decoded)``
  in bits, where each side runs the continuation tokens over its own cache.
- Perplexity: ``exp`` of the mean negative log-likelihood of continuation tokens ``1 .. C-1``
  (token 0 would need logits at the last cached position, which a cache does not hold).

Invariants:
1. The reference side (original cache) is computed once per sweep (``ContinuationReference``)
   and never mutated (enforced: frozen dataclass; caches are rebuilt from tensors per forward).
2. Capturing queries registers forward pre-hooks on the model's attention modules for one
   forward and removes them afterwards, also on error (enforced: ``try/finally``).
3. The model is a Llama-family attention with ``q_proj``, ``head_dim``, ``scaling``,
   ``num_key_value_groups`` and rotary ``position_embeddings`` passed to the attention module
   (checked: ``UnsupportedModelError`` otherwise; standard RoPE is assumed, and checked on the
   tiny Llama: the captured queries reproduce the model's own attention outputs,
   ``tests/test_delta_metrics.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from seqkv.errors import InvalidKVError, SeqKVError
from seqkv.kvcache import cache_from_tensor
from seqkv.models.adapter import CausalLM


class UnsupportedModelError(SeqKVError, TypeError):
    """The model's attention modules do not have the structure the attention metric reads."""


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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class _Attention:
    """What the metric reads of one attention module."""

    module: nn.Module
    q_proj: nn.Module
    head_dim: int
    groups: int
    scaling: float


def _attention_modules(model: CausalLM) -> list[_Attention]:
    base = model.model.base_model
    layers = getattr(base, "layers", None)
    if layers is None:
        raise UnsupportedModelError(f"model {model.name!r} has no decoder .layers")
    modules: list[_Attention] = []
    needed = ("q_proj", "head_dim", "scaling", "num_key_value_groups")
    for layer in layers:
        attention = getattr(layer, "self_attn", None)
        if not isinstance(attention, nn.Module) or not all(
                hasattr(attention, n) for n in needed):
            raise UnsupportedModelError(
                f"model {model.name!r}: the attention metric needs Llama-style self_attn "
                f"modules with {', '.join(needed)}"
            )
        fields: Any = attention  # torch types module attributes as Tensor | Module
        modules.append(_Attention(attention, fields.q_proj, int(fields.head_dim),
                                  int(fields.num_key_value_groups), float(fields.scaling)))
    return modules


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


def _continue(model: CausalLM, kv: torch.Tensor, continuation: Sequence[int]) -> torch.Tensor:
    """Log-probabilities ``[C, vocab]`` (float64) of running ``continuation`` over ``kv``."""
    cache = cache_from_tensor(kv.to(model.device, model.dtype))
    ids = torch.tensor([list(continuation)], dtype=torch.long, device=model.device)  # [1, C]
    with torch.inference_mode():
        logits = model.model(input_ids=ids, cache=cache, use_cache=True).logits
    return torch.log_softmax(logits[0].double().cpu(), dim=-1)  # [C, V]


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
        raise ValueError("the continuation needs at least 2 tokens for a perplexity")
    original = original.detach().to("cpu", torch.float32)
    modules = _attention_modules(model)
    captured: dict[int, torch.Tensor] = {}

    def hook_for(index: int, attention: _Attention) -> Any:
        def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            embeddings = kwargs.get("position_embeddings")
            if hidden is None or embeddings is None:
                raise UnsupportedModelError(
                    "the attention module did not receive hidden_states and rotary "
                    "position_embeddings"
                )
            cos, sin = embeddings  # [1, C, D] each
            q = attention.q_proj(hidden)  # [1, C, Hq * D]
            q = q.view(*hidden.shape[:-1], -1, attention.head_dim)  # [1, C, Hq, D]
            q = q.transpose(1, 2)  # [1, Hq, C, D]
            q = q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)  # [1, Hq, C, D]
            captured[index] = q[0].detach().float().cpu()  # [Hq, C, D]

        return hook

    handles = [m.module.register_forward_pre_hook(hook_for(i, m), with_kwargs=True)
               for i, m in enumerate(modules)]
    try:
        log_probs = _continue(model, original, tokens)
    finally:
        for handle in handles:
            handle.remove()
    if len(captured) != len(modules):
        raise UnsupportedModelError("not every attention module saw the continuation")
    queries = tuple(captured[i] for i in range(len(modules)))
    outputs = tuple(
        _attend(queries[i], original[i], m.groups, m.scaling) for i, m in enumerate(modules)
    )
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
    modules = _attention_modules(model)
    errors = []
    for i, attention in enumerate(modules):
        out = _attend(reference.queries[i], decoded[i], attention.groups, attention.scaling)
        ref = reference.outputs[i]
        errors.append(float((out - ref).square().sum() / ref.square().sum().clamp_min(1e-300)))
    log_probs = _continue(model, decoded, reference.continuation)
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

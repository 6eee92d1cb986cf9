"""The Llama backbone, and the architectures that share its module layout (Mistral, Qwen2).

Layout (transformers' ``LlamaDecoderLayer``): ``h += o_proj(attention(rope(q_proj(n1(h))),
rope(k_proj(n1(h))), v_proj(n1(h))))``, then ``h += mlp(n2(h))``, RMSNorms ``n1``, ``n2``
(``input_layernorm``, ``post_attention_layernorm``), separate q/k/v projections with grouped-query
attention, full rotary embedding, final ``norm`` and the LM head. Qwen2 is the same layout with
biases on q/k/v (inside its projection modules); Mistral is Llama with a sliding window.

Invariants:
1. Registered model types: ``llama``, ``mistral``, ``qwen2`` (``registry.FAMILIES``), each
   tested on a tiny random model (``tests/test_backbones.py``) (checked).
2. Sliding-window attention is refused unless the window covers every position the model has
   (enforced: the drivers' attention sees every earlier position).
3. The arithmetic is the one seqkv's row-invariant forward ran before backbones existed, op for op
   (checked: the rows and KV of SmolLM2 and the tiny Llama are bit-identical to those of that
   forward, and ``tests/test_figures_gate.py`` gates the coded figures exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from seqkv.errors import UnsupportedModelError
from seqkv.models.adapter import CausalLM
from seqkv.models.backbones.base import (
    Attend,
    BackboneGeometry,
    apply,
    embeddings,
    layer_list,
    rotary_tables,
    rotate,
    static_rope,
    submodule,
)

_FAMILY = "Llama"


@dataclass(frozen=True)
class _Layer:
    """The modules of one decoder layer."""

    input_norm: nn.Module
    q: nn.Module
    k: nn.Module
    v: nn.Module
    o: nn.Module
    post_norm: nn.Module
    mlp: nn.Module


class LlamaBackbone:
    """Llama-layout decoder (see the module docstring)."""

    def __init__(self, model: CausalLM) -> None:
        config = model.config
        model_type = str(getattr(config, "model_type", None))
        max_positions = int(config.max_position_embeddings)
        window = getattr(config, "sliding_window", None)
        if window is not None and int(window) < max_positions:
            raise UnsupportedModelError(
                f"this {model_type!r} model attends through a sliding window of {window} "
                f"positions (of {max_positions}): seqkv's own forwards attend to every earlier "
                "position; code it at the 'tokens' level"
            )
        stack = model.model.base_model
        self._rotary = static_rope(submodule(stack, "rotary_emb", model_type, _FAMILY),
                                   model_type)
        self._embed, self._head = embeddings(model, model_type, _FAMILY)
        self._norm = submodule(stack, "norm", model_type, _FAMILY)
        layers = layer_list(stack, "layers", model_type, _FAMILY)
        self._layers = tuple(
            _Layer(*(submodule(layer, path, model_type, _FAMILY) for path in (
                "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                "self_attn.o_proj", "post_attention_layernorm", "mlp")))
            for layer in layers
        )
        head_dim = model.head_dim
        self._geometry = BackboneGeometry(
            layers=len(self._layers),
            hidden=int(config.hidden_size),
            heads=int(config.num_attention_heads),
            kv_heads=model.kv_heads,
            head_dim=head_dim,
            rotary_dim=head_dim,
            vocab=model.vocab_size,
            max_positions=max_positions,
            scale=head_dim**-0.5,
        )
        self._like = torch.zeros(1, dtype=model.dtype, device=model.device)

    @property
    def geometry(self) -> BackboneGeometry:
        return self._geometry

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return apply(self._embed, ids)  # [N, hidden]

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_tables(self._rotary, positions, self._like)

    def block(self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              attend: Attend) -> torch.Tensor:
        layer = self._layers[index]
        geometry = self._geometry
        n = hidden.shape[0]
        x = apply(layer.input_norm, hidden)  # [N, hidden]
        q = apply(layer.q, x).view(n, geometry.heads, geometry.head_dim)  # [N, H, D]
        k = apply(layer.k, x).view(n, geometry.kv_heads, geometry.head_dim)  # [N, Hkv, D]
        v = apply(layer.v, x).view(n, geometry.kv_heads, geometry.head_dim)  # [N, Hkv, D]
        q = rotate(q, cos[:, None], sin[:, None])
        k = rotate(k, cos[:, None], sin[:, None])
        out = attend(index, q, k, v).reshape(n, geometry.heads * geometry.head_dim)  # [N, H*D]
        hidden = hidden + apply(layer.o, out)
        return hidden + apply(layer.mlp, apply(layer.post_norm, hidden))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return apply(self._head, apply(self._norm, hidden))  # [N, vocab]

    def first_layer_kv(self, ids: torch.Tensor) -> torch.Tensor:
        layer = self._layers[0]
        geometry = self._geometry
        x = apply(layer.input_norm, self.embed(ids))  # [N, hidden]
        shape = (ids.shape[0], geometry.kv_heads, geometry.head_dim)
        keys = apply(layer.k, x).view(shape)  # [N, Hkv, D]; rotation at position 0: identity
        values = apply(layer.v, x).view(shape)  # [N, Hkv, D]
        return torch.stack((keys, values), dim=1)  # [N, 2, Hkv, D]

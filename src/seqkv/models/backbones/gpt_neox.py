"""The GPT-NeoX backbone (Pythia, GPT-NeoX-20B and their fine-tunes).

Layout (transformers' ``GPTNeoXLayer``), different from Llama's in every part a driver could
touch: one fused ``query_key_value`` projection whose output holds, per head, that head's query,
key and value side by side (``[N, heads, 3 * head_dim]``); rotary embedding on the leading
``rotary_pct`` of each head only; LayerNorms with biases; a GELU MLP (``dense_h_to_4h``,
``dense_4h_to_h``); no grouped-query attention; and, with ``use_parallel_residual``, attention and
MLP both read the layer's input: ``h = mlp(n2(h)) + attention(n1(h)) + h`` (otherwise
``a = attention(n1(h)) + h``, ``h = mlp(n2(a)) + a``). Embedding ``embed_in``, final
``final_layer_norm``, LM head ``embed_out`` (``lm_head`` in transformers 5), both read through
transformers' ``get_input_embeddings`` / ``get_output_embeddings``.

Invariants:
1. Registered model type: ``gpt_neox`` (``registry.FAMILIES``), tested on tiny random models with
   and without the parallel residual (checked).
2. The sums run in transformers' order (``mlp + attention + h``), so the only difference from
   transformers' forward is the attention core's reduction order (checked: float32 noise,
   ``tests/test_backbones.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

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

_FAMILY = "GPT-NeoX"


@dataclass(frozen=True)
class _Layer:
    """The modules of one GPT-NeoX layer."""

    input_norm: nn.Module
    qkv: nn.Module
    dense: nn.Module
    post_norm: nn.Module
    mlp: nn.Module


class GPTNeoXBackbone:
    """GPT-NeoX decoder (see the module docstring)."""

    def __init__(self, model: CausalLM) -> None:
        config = model.config
        model_type = str(getattr(config, "model_type", None))
        stack = model.model.base_model
        rotary = static_rope(submodule(stack, "rotary_emb", model_type, _FAMILY), model_type)
        self._rotary = rotary
        self._embed, self._head = embeddings(model, model_type, _FAMILY)
        self._norm = submodule(stack, "final_layer_norm", model_type, _FAMILY)
        layers = layer_list(stack, "layers", model_type, _FAMILY)
        self._layers = tuple(
            _Layer(*(submodule(layer, path, model_type, _FAMILY) for path in (
                "input_layernorm", "attention.query_key_value", "attention.dense",
                "post_attention_layernorm", "mlp")))
            for layer in layers
        )
        self._parallel = bool(config.use_parallel_residual)
        heads = int(config.num_attention_heads)
        head_dim = int(config.hidden_size) // heads
        inverse_frequencies = getattr(rotary, "inv_freq", None)
        assert isinstance(inverse_frequencies, torch.Tensor), "a rotary module has inv_freq"
        self._geometry = BackboneGeometry(
            layers=len(self._layers),
            hidden=int(config.hidden_size),
            heads=heads,
            kv_heads=heads,
            head_dim=head_dim,
            rotary_dim=2 * inverse_frequencies.numel(),
            vocab=model.vocab_size,
            max_positions=int(config.max_position_embeddings),
            scale=head_dim**-0.5,
        )
        self._like = torch.zeros(1, dtype=model.dtype, device=model.device)

    @property
    def geometry(self) -> BackboneGeometry:
        return self._geometry

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return apply(self._embed, ids)  # [N, hidden]; the embedding dropout is off in eval

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_tables(self._rotary, positions, self._like)  # [N, rotary_dim] each

    def _qkv(self, layer: _Layer, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        geometry = self._geometry
        fused = apply(layer.qkv, x).view(x.shape[0], geometry.heads, 3 * geometry.head_dim)
        return fused.chunk(3, dim=-1)  # q, k, v: [N, H, D] each

    def block(self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              attend: Attend) -> torch.Tensor:
        layer = self._layers[index]
        geometry = self._geometry
        q, k, v = self._qkv(layer, apply(layer.input_norm, hidden))
        q = rotate(q, cos[:, None], sin[:, None])  # [N, H, D]
        k = rotate(k, cos[:, None], sin[:, None])  # [N, H, D]
        out = attend(index, q, k, v).reshape(hidden.shape[0], geometry.hidden)  # [N, H*D]
        attention = apply(layer.dense, out)
        if self._parallel:
            return apply(layer.mlp, apply(layer.post_norm, hidden)) + attention + hidden
        attended = attention + hidden
        return apply(layer.mlp, apply(layer.post_norm, attended)) + attended

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return apply(self._head, apply(self._norm, hidden))  # [N, vocab]

    def first_layer_kv(self, ids: torch.Tensor) -> torch.Tensor:
        layer = self._layers[0]
        _, keys, values = self._qkv(layer, apply(layer.input_norm, self.embed(ids)))
        return torch.stack((keys, values), dim=1)  # [N, 2, H, D]; position 0: no rotation

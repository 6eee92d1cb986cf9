"""Conversions between transformers' ``DynamicCache`` and one stacked KV tensor.

seqkv works on a single session's cache as one float tensor of shape
``[layers, 2, kv_heads, tokens, head_dim]`` (index 0 of the second axis holds keys, 1 values).

Invariants:
1. Only batch size 1 is accepted: a .skv file holds one session (enforced, InvalidKVError).
2. ``cache_from_tensor(tensor_from_cache(c))`` holds the same keys and values as ``c``
   (checked by tests).
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from seqkv.digests import Digest, digest
from seqkv.errors import InvalidKVError


def kv_digest(kv: torch.Tensor) -> Digest:
    """The digest of a KV tensor's float32 bytes, hashed in place (a contiguous float32 CPU
    tensor is not copied: a 4,000-token SmolLM2 KV is 184 MB)."""
    array = np.ascontiguousarray(kv.detach().to("cpu", torch.float32).numpy())
    return digest(array.data.cast("B"))


def tensor_from_cache(cache: DynamicCache) -> torch.Tensor:
    """Stack a batch-1 cache into ``[layers, 2, kv_heads, tokens, head_dim]``."""
    stacked = []
    for index, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)):
            raise InvalidKVError(f"layer {index} of the KV cache holds no keys and values")
        if keys.dim() != 4 or keys.shape != values.shape:
            raise InvalidKVError(f"layer {index} of the KV cache has no [B, H, T, D] keys/values")
        if keys.shape[0] != 1:
            raise InvalidKVError(
                f"the KV cache has batch size {keys.shape[0]}; seqkv stores one session per "
                "file: split the batch first"
            )
        stacked.append(torch.stack([keys[0], values[0]]))  # [2, H, T, D]
    if not stacked:
        raise InvalidKVError("the KV cache is empty: it holds no layers")
    shapes = {tuple(s.shape) for s in stacked}
    if len(shapes) != 1:
        raise InvalidKVError(f"KV cache layers have different shapes: {sorted(shapes)}")
    return torch.stack(stacked)  # [L, 2, H, T, D]


def cache_from_tensor(kv: torch.Tensor, batch: int = 1) -> DynamicCache:
    """A ``DynamicCache`` holding ``kv`` (``[layers, 2, kv_heads, tokens, head_dim]``) for each
    of ``batch`` sequences (copies: a step appends to every row)."""
    if kv.dim() != 5 or kv.shape[1] != 2:
        raise InvalidKVError(f"expected a [layers, 2, heads, tokens, dim] tensor, got {kv.shape}")
    cache = DynamicCache()
    for layer in range(kv.shape[0]):
        keys = kv[layer, 0].unsqueeze(0).expand(batch, -1, -1, -1).contiguous()  # [B, H, T, D]
        values = kv[layer, 1].unsqueeze(0).expand(batch, -1, -1, -1).contiguous()  # [B, H, T, D]
        cache.update(keys, values, layer)
    return cache


def batch_row(cache: DynamicCache, row: int) -> torch.Tensor:
    """Row ``row`` of a batched cache as ``[layers, 2, kv_heads, tokens, head_dim]`` float32 on
    the CPU."""
    stacked = []
    for index, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)):
            raise InvalidKVError(f"layer {index} of the KV cache holds no keys and values")
        stacked.append(torch.stack([keys[row], values[row]]))  # [2, H, T, D]
    return torch.stack(stacked).detach().to("cpu", torch.float32)  # [L, 2, H, T, D]

"""Gather and scatter whole blocks between an engine's paged KV cache and seqkv's KV tensors.

A paged cache holds one tensor per attention layer; a request's KV lives in the blocks its block
table names, ``block_size`` token slots each (slot ``s`` is block ``s // block_size``, offset
``s % block_size``: the slot mapping). Layouts, per layer:

- ``cpu`` (vLLM 0.32's CPU attention backend, ``vec`` kernels): a tensor shaped
  ``[num_blocks, kv_heads, block_size, 2 * head_dim]`` whose memory, per block and head, holds
  the keys **transposed**, ``[head_dim, block_size]`` (tokens contiguous, for the kernel's dot
  products), then the values ``[block_size, head_dim]``. Measured from vLLM's own
  ``cpu_attn_reshape_and_cache`` (``benchmarks/vllm_layout_probe.py``, committed as
  ``tests/data/vllm_cpu_layout.safetensors``); ``SeqKVConnector`` re-checks it against the
  running vLLM when the caches are registered and refuses to start if it differs;
- ``nhd`` (vLLM's flash-attention layout): ``[2, num_blocks, block_size, kv_heads, head_dim]``.

seqkv's side is ``[blocks, layers, 2, kv_heads, block_size, head_dim]`` float32.

Invariants:
1. ``scatter(gather(caches, ids))`` leaves the caches unchanged, and ``gather`` after
   ``scatter(kv)`` returns ``kv`` rounded to the cache dtype (checked: tests).
2. ``gather`` copies: what it returns does not change when the engine reuses the blocks
   (enforced: ``index_select`` allocates).
3. Scatter writes only the named blocks (enforced: indexed assignment).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from seqkv.errors import ConnectorConfigError
from seqkv.types import KVGeometry

LayoutName = Literal["cpu", "nhd"]
LAYOUTS: tuple[LayoutName, ...] = get_args(LayoutName)


@dataclass(frozen=True)
class PagedLayout:
    """How one layer's paged tensor holds ``[2, kv_heads, block_size, head_dim]`` per block.

    >>> layout = PagedLayout("cpu", KVGeometry(1, 2, 4), block_size=3)
    >>> cache = layout.empty(num_blocks=5, dtype=torch.float32)
    >>> kv = torch.randn(2, 1, 2, 2, 3, 4)   # [blocks, L, 2, H, B, D]
    >>> layout.scatter([cache], [4, 1], kv)
    >>> torch.equal(layout.gather([cache], [4, 1]), kv)
    True
    """

    name: LayoutName
    geometry: KVGeometry
    block_size: int

    def __post_init__(self) -> None:
        if self.name not in LAYOUTS:
            raise ConnectorConfigError(f"unknown paged layout {self.name!r}; one of {LAYOUTS}")

    def shape(self, num_blocks: int) -> tuple[int, ...]:
        g, b = self.geometry, self.block_size
        if self.name == "cpu":
            return (num_blocks, g.kv_heads, b, 2 * g.head_dim)
        return (2, num_blocks, b, g.kv_heads, g.head_dim)

    def empty(self, num_blocks: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(self.shape(num_blocks), dtype=dtype)

    def check(self, cache: torch.Tensor) -> None:
        expected = self.shape(cache.shape[0] if self.name == "cpu" else cache.shape[1])
        if tuple(cache.shape) != expected:
            raise ConnectorConfigError(
                f"a paged KV layer has shape {tuple(cache.shape)}; the {self.name!r} layout of "
                f"this model is {expected}: pass the engine's layout"
            )

    def key_value_views(self, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cache``'s keys and values, each viewed as ``[num_blocks, kv_heads, block_size,
        head_dim]`` (views: writing into them writes the cache)."""
        g, b = self.geometry, self.block_size
        if self.name == "cpu":
            halves = cache.view(cache.shape[0], g.kv_heads, 2, b * g.head_dim)  # [N, H, 2, B*D]
            keys = halves[:, :, 0].view(cache.shape[0], g.kv_heads, g.head_dim, b)  # [N, H, D, B]
            values = halves[:, :, 1].view(cache.shape[0], g.kv_heads, b, g.head_dim)
            return keys.transpose(2, 3), values  # [N, H, B, D] each
        return cache[0].transpose(1, 2), cache[1].transpose(1, 2)  # [N, B, H, D] -> [N, H, B, D]

    def gather(self, caches: Sequence[torch.Tensor], block_ids: Sequence[int]) -> torch.Tensor:
        """``[blocks, layers, 2, kv_heads, block_size, head_dim]`` in the caches' dtype."""
        index = torch.tensor(list(block_ids), dtype=torch.long)
        per_layer = []
        for cache in caches:
            keys, values = self.key_value_views(cache)
            per_layer.append(torch.stack([keys.index_select(0, index),
                                          values.index_select(0, index)], dim=1))  # [n, 2, H, B, D]
        return torch.stack(per_layer, dim=1)  # [n, L, 2, H, B, D]

    def scatter(self, caches: Sequence[torch.Tensor], block_ids: Sequence[int],
                kv: torch.Tensor) -> None:
        """Write ``kv`` ``[blocks, layers, 2, kv_heads, block_size, head_dim]`` into the named
        blocks, converted to each cache's dtype."""
        index = torch.tensor(list(block_ids), dtype=torch.long)
        for layer, cache in enumerate(caches):
            keys, values = self.key_value_views(cache)
            keys[index] = kv[:, layer, 0].to(cache.dtype)
            values[index] = kv[:, layer, 1].to(cache.dtype)

"""Gather and scatter whole blocks between an engine's paged KV cache and seqkv's KV tensors.

A paged cache holds one tensor per attention layer; a request's KV lives in the blocks its block
table names, ``block_size`` token slots each (slot ``s`` is block ``s // block_size``, offset
``s % block_size``: the slot mapping). Layouts, per layer:

- ``cpu`` (vLLM's CPU attention backend): ``[num_blocks, kv_heads, block_size, 2 * head_dim]``,
  which the backend reads as ``[num_blocks, kv_heads, 2 * block_size, head_dim]`` with the
  keys in the first ``block_size`` rows and the values in the rest, i.e.
  ``[num_blocks, kv_heads, 2, block_size, head_dim]``;
- ``nhd`` (vLLM's flash-attention layout): ``[2, num_blocks, block_size, kv_heads, head_dim]``.

seqkv's side is ``[blocks, layers, 2, kv_heads, block_size, head_dim]`` float32.

Invariants:
1. ``scatter(gather(caches, ids)) `` leaves the caches unchanged, and ``gather`` after
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

    def blocks_view(self, cache: torch.Tensor) -> torch.Tensor:
        """``cache`` viewed as ``[num_blocks, 2, kv_heads, block_size, head_dim]`` (a view when
        the layout allows, for writing)."""
        g, b = self.geometry, self.block_size
        if self.name == "cpu":
            view = cache.view(cache.shape[0], g.kv_heads, 2, b, g.head_dim)  # [N, H, 2, B, D]
            return view.permute(0, 2, 1, 3, 4)  # [N, 2, H, B, D]
        return cache.permute(1, 0, 3, 2, 4)  # [2, N, B, H, D] -> [N, 2, H, B, D]

    def gather(self, caches: Sequence[torch.Tensor], block_ids: Sequence[int]) -> torch.Tensor:
        """``[blocks, layers, 2, kv_heads, block_size, head_dim]`` in the caches' dtype."""
        index = torch.tensor(list(block_ids), dtype=torch.long)
        per_layer = [self.blocks_view(c).index_select(0, index) for c in caches]  # [n, 2, H, B, D]
        return torch.stack(per_layer, dim=1)  # [n, L, 2, H, B, D]

    def scatter(self, caches: Sequence[torch.Tensor], block_ids: Sequence[int],
                kv: torch.Tensor) -> None:
        """Write ``kv`` ``[blocks, layers, 2, kv_heads, block_size, head_dim]`` into the named
        blocks, converted to each cache's dtype."""
        index = torch.tensor(list(block_ids), dtype=torch.long)
        for layer, cache in enumerate(caches):
            view = self.blocks_view(cache)  # [N, 2, H, B, D]
            view[index] = kv[:, layer].to(cache.dtype)

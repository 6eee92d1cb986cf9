"""What the scheduler side tells the worker side for one engine step (the connector metadata).

Invariants:
1. A plan is immutable and holds only ints, bytes and strings: it pickles across vLLM's
   process boundary and the worker cannot change the scheduler's state through it (enforced:
   frozen dataclasses of tuples).
2. ``BlockOrder.keys[i]`` is the key of the block ``BlockOrder.block_ids[i]`` (enforced: built
   together; lengths checked).
3. ``protected`` holds every key pinned by a match whose load has not been planned yet: the
   worker never evicts them (enforced by ``WarmTier.evict``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockOrder:
    """Warm blocks of one request: to decode into its paged blocks before this step's forward
    (a load), or to code from them after it (a save)."""

    request_id: str
    keys: tuple[bytes, ...]
    block_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.block_ids):
            raise ValueError(f"{len(self.keys)} keys for {len(self.block_ids)} blocks")


@dataclass(frozen=True)
class StepPlan:
    loads: tuple[BlockOrder, ...] = ()
    saves: tuple[BlockOrder, ...] = ()
    protected: frozenset[bytes] = frozenset()

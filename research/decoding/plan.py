"""Block partitions planned by the encoder: long blocks only where the decoder's guesses hold.

A blocked stream (``research.decoding.blocked``) is exact for *any* partition, so the partition is
a pure cost choice, and the encoder, which knows every token, can make it. For a draft policy
that reads only tokens (``PromptLookup``, ``NoDraft``; no Jacobi hints), the forwards a decoder
spends on a block are a function of the tokens alone: ``block_forwards`` replays the decoder's
acceptance loop without the model. ``plan_blocks`` then chooses, by dynamic programming over
block ends, the partition that minimises the modelled decode time ``sum(forwards(b) *
cost(len(b)))``. Where nothing repeats it picks blocks of one position (the codec's own
schedule, no waste); where the text repeats itself, long blocks.

Invariants:
1. ``block_forwards`` equals the ``forwards`` a ``blocked_decode`` with the same tokens-only
   policy spends on that block (checked by ``tests/test_decoding_plan.py``): it shares
   ``fill_block`` with the decoder and mirrors its acceptance loop.
2. The plan is optimal for the given cost model and allowed lengths (checked against brute
   force by the tests): the decoder enters block ``[s, e)`` knowing exactly ``tokens[:s + 1]``
   whatever the blocks before it, so a block's cost does not depend on the earlier partition
   and the dynamic program is exact.
3. A plan never changes the bits' cost beyond rounding: every partition codes each token under a
   row of the same model on the same prefix (assumed; the benchmark reports the cross-entropy).

The planner calls the policy O(count * len(lengths) * forwards) times; with prompt lookup that is
quadratic in the count, fine for the prototype's hundreds of tokens, not for 100k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from research.decoding.blocked import fill_block
from seqkv.levels.drafts import DraftPolicy

CostModel = Callable[[int], float]  # relative time of one forward of that many positions


def block_forwards(tokens: Sequence[int], s: int, e: int, policy: DraftPolicy) -> int:
    """Forwards a blocked decoder with tokens-only ``policy`` spends on block ``[s, e)``.

    >>> from seqkv.levels.drafts import NoDraft, PromptLookup
    >>> block_forwards([1, 2, 1, 2, 1, 2, 1], 0, 4, NoDraft())
    4
    >>> block_forwards([1, 2, 1, 2, 1, 2, 1], 2, 6, PromptLookup())
    1
    """
    known = s + 1
    forwards = 0
    while True:
        forwards += 1
        inputs = fill_block(tokens[:known], s, e, policy, [])
        for position in range(known, e):
            if inputs[position - s] != tokens[position]:
                known = position + 1
                break
        else:
            return forwards


def plan_blocks(tokens: Sequence[int], policy: DraftPolicy, cost: CostModel,
                lengths: Sequence[int] = (1, 4, 8, 16, 32)) -> tuple[int, ...]:
    """The partition of ``tokens`` with the least modelled decode time under ``policy``.

    >>> from seqkv.levels.drafts import PromptLookup
    >>> plan_blocks([7, 8, 9, 3, 7, 8, 9, 3, 7, 8, 9, 3], PromptLookup(), lambda n: 1 + n / 8,
    ...             lengths=(1, 4, 8))
    (1, 1, 1, 1, 8)
    """
    if 1 not in lengths or any(length < 1 for length in lengths):
        raise ValueError(f"the block lengths must be positive and include 1, got {list(lengths)}")
    count = len(tokens)
    best = [0.0] + [math.inf] * count
    choice = [0] * (count + 1)
    for e in range(1, count + 1):
        for length in sorted(set(lengths)):
            s = e - length
            if s < 0:
                break
            total = best[s] + block_forwards(tokens, s, e, policy) * cost(length)
            if total < best[e]:
                best[e], choice[e] = total, length
    plan: list[int] = []
    e = count
    while e > 0:
        plan.append(choice[e])
        e -= choice[e]
    return tuple(reversed(plan))


def table_cost(seconds: dict[int, float]) -> CostModel:
    """A cost model from measured seconds per forward length (``probes.chunk_timings``)."""
    def cost(length: int) -> float:
        if length not in seconds:
            raise ValueError(f"no measured cost for a forward of {length} positions")
        return seconds[length]
    return cost

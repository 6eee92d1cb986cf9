"""The ``segments:N`` level: N independent segments decoded in parallel, more bits for speed.

The tail is split into N consecutive segments (``split_lengths``), each coded as a sequence of
its own after the start token (or the shared prefix) on the row-invariant forward, and their
symbols interleave round by round in one arithmetic code (``seqkv.levels.row_streams``). The
decoder steps the N segments together: one forward per round, about N times fewer forwards than
``rows``, at the price of each segment's context starting over (measured in
``reports/decode_levels.md``). The KV is then recomputed in one chunked pass over all tokens.

Invariants:
1. N >= 2 (enforced: ``parse`` and the constructor refuse fewer); the file records N.
2. Segment lengths are a function of the token count and N (enforced: ``split_lengths``).
"""

from __future__ import annotations

from dataclasses import dataclass

from seqkv.errors import InvalidLevelError
from seqkv.levels.base import LevelSpec
from seqkv.levels.rows import BATCH_GROUP, RowStreamsLevel
from seqkv.limits import MAX_SEGMENTS


@dataclass(frozen=True)
class SegmentsLevel(RowStreamsLevel):
    segments: int = 2

    def __post_init__(self) -> None:
        if not 2 <= self.segments <= MAX_SEGMENTS:
            raise InvalidLevelError(
                f"the segments level takes 2 to {MAX_SEGMENTS} segments, not {self.segments}")

    @property
    def spec(self) -> LevelSpec:
        return LevelSpec(f"segments:{self.segments}", model_coded=True, schedule="rows",
                         decoding=f"{self.segments} segments step together: one forward per "
                                  f"{self.segments} tokens, then one chunked KV pass",
                         batch_group=BATCH_GROUP)

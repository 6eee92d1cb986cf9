"""The execution profile a file records: what a decoder must reproduce for each schedule.

Invariants:
1. The ``rows`` schedule's profile carries the row-invariant forward's calibrated row block, so a
   machine that pads products differently is a mismatch, not a checksum failure after decoding
   (enforced).
"""

from __future__ import annotations

from dataclasses import replace

from seqkv.models.adapter import CausalLM
from seqkv.models.rows import row_forward
from seqkv.types import ExecutionProfile, Schedule


def execution_profile(model: CausalLM, schedule: Schedule) -> ExecutionProfile:
    profile = model.profile(schedule)
    if schedule == "rows":
        profile = replace(profile, row_block=row_forward(model).row_block)
    return profile

"""The execution profile a file records: what a decoder must reproduce for each schedule.

Invariants:
1. The ``rows`` schedule's profile carries the row-invariant forward's calibrated row block, so a
   machine that pads products differently is a mismatch, not a checksum failure after decoding
   (enforced).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from seqkv.errors import CorruptFileError
from seqkv.formats.skv_legacy import ReaderModel, ReaderSide
from seqkv.models.adapter import CausalLM
from seqkv.models.rows import row_forward
from seqkv.schedule import current_profile
from seqkv.types import ExecutionProfile, Schedule


def execution_profile(model: CausalLM, schedule: Schedule) -> ExecutionProfile:
    profile = model.profile(schedule)
    if schedule == "rows":
        profile = replace(profile, row_block=row_forward(model).row_block)
    return profile


def reader_side(model: CausalLM | None) -> ReaderSide:
    """What reading an old .skv file on this machine knows of the reader: the model (if any)
    and this machine's profile for a file's schedule and dtype."""
    if model is None:
        return ReaderSide(None, lambda recorded: current_profile(
            _dtype_of(recorded.dtype), torch.device("cpu"), recorded.schedule))
    return ReaderSide(ReaderModel(model.identity, model.start_token_id, model.geometry),
                      lambda recorded: execution_profile(model, recorded.schedule))


def _dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptFileError(f"the file's profile names an unknown dtype {name!r}")
    return dtype

"""Faster exact decoding of the token stream: measurements, prototypes and the decode bench.

The product is ``seqkv.levels`` (the coding levels in the .skv file) on the row-invariant forward
``seqkv.models.rows``; this package holds what led there and what measures it:

- ``research.bench.decode`` (``python -m research.bench decode``): bits per token and decode
  speed of every level.

- ``probes``: is a logit row bit-identical across chunk shapes, later tokens, batch shapes; what
  a forward costs per chunk length and batch size.
- ``drafts``: deterministic draft policies (prompt lookup, Jacobi guesses).
- ``speculative``: speculative decoding whose schedule the encoder replays.
- ``blocked``: speculative decoding against a prefill in blocks (any partition); the encoder
  runs no drafts and the decoder's policy is free.
- ``plan``: the encoder's choice of partition: long blocks only where the decoder's guesses hold.

The speculative prototypes work on transformers' own forward, whose rows depend on the chunk
shape, so the encoder has to replay or plan the decoder's schedule; they measured 1.0x on prose.
The row-invariant forward removed that constraint, and batching sessions or segments, not
speculation, is what makes decoding fast here (``reports/decode_levels.md``).
"""

from research.decoding.blocked import DEFAULT_BLOCK, blocked_decode, blocked_encode
from research.decoding.plan import plan_blocks
from research.decoding.speculative import speculative_decode, speculative_encode
from research.decoding.stream import CodedStream, DecodedStream, ScheduleStats
from seqkv.levels.drafts import DraftPolicy, Fallback, JacobiDraft, NoDraft, PromptLookup

__all__ = [
    "DEFAULT_BLOCK",
    "CodedStream",
    "DecodedStream",
    "DraftPolicy",
    "Fallback",
    "JacobiDraft",
    "NoDraft",
    "PromptLookup",
    "ScheduleStats",
    "blocked_decode",
    "blocked_encode",
    "plan_blocks",
    "speculative_decode",
    "speculative_encode",
]

"""Faster exact decoding of the token stream: measurements and prototypes (issue 5 groundwork).

- ``probes``: is a logit row bit-identical across chunk shapes, later tokens, batch shapes; what
  a forward costs per chunk length and batch size.
- ``drafts``: deterministic draft policies (prompt lookup, Jacobi guesses).
- ``speculative``: speculative decoding whose schedule the encoder replays.
- ``blocked``: speculative decoding against a prefill in blocks (any partition); the encoder
  runs no drafts and the decoder's policy is free.
- ``plan``: the encoder's choice of partition: long blocks only where the decoder's guesses hold.

Nothing here is wired into ``seqkv.codec`` or the ``.skv`` format yet.
"""

from seqkv.decoding.blocked import DEFAULT_BLOCK, blocked_decode, blocked_encode
from seqkv.decoding.drafts import DraftPolicy, Fallback, JacobiDraft, NoDraft, PromptLookup
from seqkv.decoding.plan import plan_blocks
from seqkv.decoding.speculative import speculative_decode, speculative_encode
from seqkv.decoding.stream import CodedStream, DecodedStream, ScheduleStats

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

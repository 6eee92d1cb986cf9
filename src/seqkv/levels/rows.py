"""The ``rows`` level: the model's probabilities on the row-invariant forward, the same bits as
``tokens``, a prefill-speed encoder and decoding batched across sessions.

Tokens are coded under ``seqkv.models.rows``, whose every logit row has the same bits however
rows are chunked or batched. So the encoder computes all rows in chunks of 256 (near prefill
speed), and the decoder runs one forward per token whose spare rows (the padding to the engine's
row block) check prompt-lookup guesses; many sessions share each forward
(``seqkv.decompress_batch``). The coding machinery is ``seqkv.levels.row_streams``.

Invariants:
1. The level codes one segment; ``segments`` is the same machinery with several (enforced: both
   are ``RowStreamsLevel``).
2. Files of both levels decode together (their ``batch_group`` is the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqkv.levels.base import (
    DecodeOutput,
    DecodeRequest,
    EncodeOutput,
    EncodeRequest,
    LevelSpec,
)
from seqkv.levels.row_streams import decode_rows, encode_rows, new_job, recompute_kv
from seqkv.models.adapter import CausalLM
from seqkv.models.rows import row_forward
from seqkv.schedule import pinned_threads, schedule_threads
from seqkv.session import split_lengths

BATCH_GROUP = "row-forward"


@dataclass(frozen=True)
class RowStreamsLevel:
    """Tokens coded as ``segments`` streams on the row-invariant forward."""

    segments: int = 1

    @property
    def spec(self) -> LevelSpec:
        return LevelSpec("rows", model_coded=True, schedule="rows",
                         decoding="one forward per token; sessions share forwards",
                         batch_group=BATCH_GROUP)

    def encode(self, request: EncodeRequest) -> EncodeOutput:
        engine = row_forward(request.model)
        before = engine.forwards
        lengths = split_lengths(len(request.tail), self.segments)
        with pinned_threads(schedule_threads("rows")):
            trace, kv = encode_rows(engine, request.encoder, request.tail, lengths,
                                    request.context, request.prefix, request.classes)
            if kv is None:
                kv = recompute_kv(engine, request.tail, request.prefix)
        return EncodeOutput(trace, kv, lengths, engine.forwards - before)

    def decode(self, model: CausalLM | None,
               requests: Sequence[DecodeRequest]) -> list[DecodeOutput]:
        """Every request's streams step together, one forward per round."""
        assert model is not None, "the row-stream levels need the model"
        engine = row_forward(model)
        before = engine.forwards
        with pinned_threads(schedule_threads("rows")):
            jobs = [new_job(engine, r.decoder, r.segments, r.context, r.prefix, r.classes)
                    for r in requests]
            decode_rows(engine, jobs)
        shared = engine.forwards - before
        outputs = []
        for request, job in zip(requests, jobs, strict=True):
            tail, trace = job.tokens()
            kv = None
            forwards = shared
            if request.with_kv:
                if len(job.streams) == 1:
                    kv = job.kv()
                else:
                    before = engine.forwards
                    with pinned_threads(schedule_threads("rows")):
                        kv = recompute_kv(engine, tail, request.prefix)
                    forwards += engine.forwards - before
            outputs.append(DecodeOutput(tail, trace, kv, forwards))
        return outputs


@dataclass(frozen=True)
class RowsLevel(RowStreamsLevel):
    """The ``rows`` level: one stream."""

    segments: int = 1

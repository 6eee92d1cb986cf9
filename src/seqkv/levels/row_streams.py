"""Coding and decoding token streams on the row-invariant forward: what ``rows`` and
``segments`` share.

A file's tail is coded as one or more segments ("streams"), each a sequence of its own that
starts after the start token or after the shared prefix. The encoder forwards every segment's
tokens in large windows (each row of the row-invariant forward is independent of how rows are
grouped, ``seqkv.models.rows``) and codes their symbols into ONE arithmetic code, round by round
(``segment_order``). The decoder steps every stream of every file it was given together, one
forward per round, and fills the rows the forward's padding computes anyway with prompt-lookup
guesses for streams that are alone in their file.

Invariants:
1. The encoder computes each row in large chunks and the decoder in single rows or small
   batches; both get the same bits because of row invariance (assumed of the engine; the engine
   calibrates it on the machine and the decoder verifies checksums).
2. Symbols enter the single arithmetic code in the decoder's order: round by round, segment by
   segment within a round (enforced: both sides follow ``segment_order``; a stream of a
   multi-stream file never decodes a guessed token ahead of its siblings).
3. A segment's first token is coded under the distribution after the start token, or after the
   shared prefix when there is one, as at the ``tokens`` level (enforced).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder
from seqkv.coding.frequencies import CumulativeTable, uniform_distribution
from seqkv.levels import base
from seqkv.levels.base import Distribution, KVClasses, TraceColumns
from seqkv.levels.drafts import PromptLookup
from seqkv.models.rows import RECOMPUTE_CHUNK_ROWS, RowForward, RowSequence, gather
from seqkv.session import Prefix

# NOTE: rows per encoder forward, as the engine's recomputation: large enough for matrix
# products to run at prefill speed, small enough that the float32 logit rows (V x 4 bytes each)
# stay ~50 MB.
ENCODE_CHUNK_ROWS = RECOMPUTE_CHUNK_ROWS


def row_start(engine: RowForward, context: int | None,
              prefix: Prefix | None) -> tuple[RowSequence, Distribution]:
    """A segment's starting sequence and the distribution its first token is coded under.

    After a prefix, the sequence holds the prefix's stored KV without its last position and the
    last prefix token is forwarded; otherwise the sequence is empty and the distribution is the
    one after ``context`` (computed on a throwaway sequence), or uniform.
    """
    if prefix is not None:
        assert prefix.kv is not None
        sequence = engine.new_sequence(prefix.kv[:, :, :, : len(prefix.tokens) - 1])
        row = engine.forward([(sequence, [prefix.tokens[-1]])])[0][0]
        return sequence, base.model_distribution(row)
    if context is None:
        return engine.new_sequence(), uniform_distribution(engine.model.vocab_size)
    return engine.new_sequence(), base.model_distribution(engine.start_row(context))


def recompute_kv(engine: RowForward, tail: Sequence[int],
                 prefix: Prefix | None) -> torch.Tensor:
    """The KV ``[layers, 2, kv_heads, tokens, head_dim]`` of prefix + tail, in chunks.

    After a prefix, the sequence starts from its stored KV without its last position and
    forwards the last prefix token first, as the coded tokens were.
    """
    if prefix is None:
        return engine.recompute(tail)
    assert prefix.kv is not None
    return engine.recompute([prefix.tokens[-1], *tail],
                            prefix.kv[:, :, :, : len(prefix.tokens) - 1])


def encode_rows(engine: RowForward, encoder: ArithmeticEncoder, tail: Sequence[int],
                lengths: Sequence[int], context: int | None, prefix: Prefix | None,
                classes: KVClasses | None = None) -> tuple[TraceColumns, torch.Tensor | None]:
    """Code ``tail`` split into segments of ``lengths`` under the row-invariant forward.

    Returns the trace and, for a single segment, the KV its forwards left (the session's KV).
    """
    start_sequence, first = row_start(engine, context, prefix)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    segments = [list(tail[offsets[j] : offsets[j + 1]]) for j in range(len(lengths))]
    sequences = gather([start_sequence] * len(segments), start_sequence.length + max(lengths))
    traces = [TraceColumns(classes=classes) for _ in segments]
    # Rounds are coded in windows: forward every segment's next ``window`` tokens in one call,
    # then code the window's symbols in the decoder's order.
    window = max(1, ENCODE_CHUNK_ROWS // len(segments))
    pending: list[Distribution] = [first for _ in segments]
    for begin in range(0, max(lengths), window):
        calls = [(sequences[j], segment[begin : begin + window])
                 for j, segment in enumerate(segments)]
        rows = engine.forward(calls)
        for step in range(begin, min(begin + window, max(lengths))):
            for j, segment in enumerate(segments):
                if step >= len(segment):
                    continue
                table, log2p = pending[j]
                token = segment[step]
                encoder.encode(table, token)
                traces[j].record(log2p, table, token)
                if step + 1 < len(segment):
                    pending[j] = base.model_distribution(rows[j][step - begin])
    merged = TraceColumns()
    for trace in traces:
        merged.extend(trace)
    kv = sequences[0].kv().to("cpu", torch.float32) if len(segments) == 1 else None
    return merged, kv


@dataclass
class _Stream:
    """One segment being decoded: its sequence, decoded tokens and next distribution."""

    sequence: RowSequence
    length: int
    context: list[int]  # tokens the drafts may copy from: the prefix, then this segment's
    distribution: Distribution
    keep_kv: bool  # forward the last token too, so the sequence ends holding every token's KV
    start: int  # positions the sequence held before the segment's first token
    tokens: list[int] = field(default_factory=list)
    trace: TraceColumns = field(default_factory=TraceColumns)

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.length

    @property
    def complete(self) -> bool:
        """Decoded, and (with ``keep_kv``) every token's KV in the sequence."""
        return self.done and (not self.keep_kv or self.sequence.length == self.start + self.length)


@dataclass
class DecodeJob:
    """One file's segments, as ``decode_rows`` steps them."""

    decoder: ArithmeticDecoder
    streams: list[_Stream]

    def decode_first(self, stream: _Stream) -> None:
        """Decode the stream's first token from its start distribution."""
        self._decode(stream, *stream.distribution)

    def decode_round(self, stream: _Stream, rows: npt.NDArray[np.float32],
                     guesses: Sequence[int]) -> int:
        """Decode what this forward's rows allow; return how many of its inputs stay valid.

        The forward's inputs were the stream's last token, then ``guesses``. Row ``r`` is the
        distribution after input ``r``; it is the encoder's while inputs ``0..r`` are right.
        """
        if stream.done:
            return 1  # the forward only appended the last token's KV
        kept = 0
        for r in range(len(rows)):
            stream.distribution = base.model_distribution(rows[r])
            kept = r + 1
            token = self._decode(stream, *stream.distribution)
            if stream.done or r >= len(guesses) or guesses[r] != token:
                break
        return kept

    def _decode(self, stream: _Stream, table: CumulativeTable,
                log2p: npt.NDArray[np.float64]) -> int:
        token = self.decoder.decode(table)
        stream.tokens.append(token)
        stream.context.append(token)
        stream.trace.record(log2p, table, token)
        return token

    def kv(self) -> torch.Tensor:
        """The session's KV, for a single-stream job decoded with ``keep_kv``."""
        (stream,) = self.streams
        assert stream.keep_kv and stream.complete
        return stream.sequence.kv().to("cpu", torch.float32)

    def tokens(self) -> tuple[list[int], TraceColumns]:
        """The decoded tail and its trace, in token order."""
        tokens: list[int] = []
        trace = TraceColumns()
        for stream in self.streams:
            tokens += stream.tokens
            trace.extend(stream.trace)
        return tokens, trace


def new_job(engine: RowForward, decoder: ArithmeticDecoder, lengths: Sequence[int],
            context: int | None, prefix: Prefix | None,
            classes: KVClasses | None = None) -> DecodeJob:
    """A job for one file; a single-segment job also keeps its KV (the session's)."""
    start_sequence, first = row_start(engine, context, prefix)
    prefix_tokens = list(prefix.tokens) if prefix is not None else []
    keep_kv = len(lengths) == 1
    streams = [_Stream(start_sequence.copy(), length, list(prefix_tokens), first, keep_kv,
                       start_sequence.length, trace=TraceColumns(classes=classes))
               for length in lengths]
    return DecodeJob(decoder, streams)


def decode_rows(engine: RowForward, jobs: Sequence[DecodeJob],
                drafts: PromptLookup | None = None) -> int:
    """Decode every job's streams together, one forward per round; return the forwards run.

    Each round forwards every active stream's last decoded token (plus, while the forward has
    fewer than the engine's row block, prompt-lookup guesses in the spare rows) and decodes the
    next tokens from the rows. Rows are row-invariant, so a guessed row's distribution is the
    encoder's whenever the guesses before it were right.
    """
    policy = drafts if drafts is not None else PromptLookup()
    forwards = 0
    order = [(job, stream) for job in jobs for stream in job.streams]
    if not order:
        return 0
    # One pool for every stream: a forward then stores all its keys in one write per layer.
    capacity = max(stream.start + stream.length for _, stream in order) + engine.row_block
    pooled = gather([stream.sequence for _, stream in order], capacity)
    for (_, stream), sequence in zip(order, pooled, strict=True):
        stream.sequence = sequence
    for job, stream in order:
        job.decode_first(stream)
    while True:
        active = [(job, stream) for job, stream in order if not stream.complete]
        if not active:
            return forwards
        # NOTE: guesses fill only the rows the padding to the row block computes anyway, and
        # only for a job of one stream: the streams of one job share an arithmetic code whose
        # symbols interleave round by round, so a stream may not decode ahead of its siblings.
        spare = max(0, engine.row_block // len(active) - 1)
        guesses = [[] if stream.done or len(job.streams) > 1
                   else policy.draft(stream.context, [], spare)
                   for job, stream in active]
        calls = [(stream.sequence, [stream.tokens[-1], *guess])
                 for (_, stream), guess in zip(active, guesses, strict=True)]
        rows = engine.forward(calls)
        forwards += 1
        for (job, stream), guess, stream_rows in zip(active, guesses, rows, strict=True):
            before = stream.sequence.length - len(stream_rows)
            kept = job.decode_round(stream, stream_rows, guess)
            stream.sequence.crop(before + kept)

"""What ``ngram`` and ``plain`` share: tokens coded without the model, KV by one chunked pass.

These levels code tokens under distributions computed in integer arithmetic from the tokens
alone, so their tokens decode identically on any machine with no model at all
(``seqkv.decompress_tokens``); the KV the residual is coded against comes from one float prefill
of the tokens, as the portable levels compute it (``seqkv.levels.kv_rebuild``); files of earlier
releases, whose KV came from the row-invariant forward, rebuild it on that schedule.

Invariants:
1. ``tables`` yields the distribution of position i before it reads ``tokens[i]``, and depends
   only on the tokens before it (enforced: the decoder appends each decoded token before asking
   for the next table).
2. Without ``with_kv`` a decode runs no model forward (enforced: ``model`` may be None).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder
from seqkv.levels.base import (
    DecodeOutput,
    DecodeRequest,
    Distribution,
    EncodeOutput,
    EncodeRequest,
    LevelSpec,
    TraceColumns,
)
from seqkv.levels.kv_rebuild import rebuild_kv
from seqkv.models.adapter import CausalLM
from seqkv.types import Schedule

# NOTE: the schedule these levels compute their KV on, and the one files of earlier releases
# did. One prefill restores a 600-token session in about the time of zstd -d + a prefill (the
# user's alternative); the row-invariant forward's chunks took 2.4-2.8x that, and at 8,185
# tokens 110 s against 34 s (its per-row attention calls; SmolLM2-135M, 2-core AMD EPYC).
KV_SCHEDULE: Schedule = "prefill"
FORMER_KV_SCHEDULES: tuple[Schedule, ...] = ("rows",)


class ModelFreeLevel(ABC):
    """A level whose tables come from the tokens alone; subclasses define ``spec``, ``tables``."""

    @property
    @abstractmethod
    def spec(self) -> LevelSpec: ...

    @abstractmethod
    def tables(self, vocab_size: int, prefix_tokens: Sequence[int],
               tokens: Sequence[int]) -> Iterator[Distribution]:
        """Tables for positions 0, 1, ...; position i's table may read ``tokens[:i]``."""

    def encode(self, request: EncodeRequest) -> EncodeOutput:
        return encode_model_free(self, request)

    def decode(self, model: CausalLM | None,
               requests: Sequence[DecodeRequest]) -> list[DecodeOutput]:
        return decode_model_free(self, model, requests)


def code_tokens(source: ModelFreeLevel, vocab_size: int, prefix_tokens: Sequence[int],
                tail: Sequence[int], encoder: ArithmeticEncoder, trace: TraceColumns) -> None:
    """The model-free coding loop, the one every user of these levels runs (the codec's
    encode, and the store's tokens-only codec, ``seqkv.store.codecs.TokensCodec``)."""
    tables = source.tables(vocab_size, prefix_tokens, tail)
    for token, (table, log2p) in zip(tail, tables, strict=False):
        encoder.encode(table, token)
        trace.record(log2p, table, token)


def decode_tokens(source: ModelFreeLevel, vocab_size: int, prefix_tokens: Sequence[int],
                  count: int, decoder: ArithmeticDecoder, trace: TraceColumns) -> list[int]:
    """The model-free decoding loop (module invariant 1)."""
    tail: list[int] = []
    tables = source.tables(vocab_size, prefix_tokens, tail)
    for _ in range(count):
        table, log2p = next(tables)
        token = decoder.decode(table)
        tail.append(token)
        trace.record(log2p, table, token)
    return tail


def encode_model_free(source: ModelFreeLevel, request: EncodeRequest) -> EncodeOutput:
    trace = TraceColumns()  # the tables are not the model's: no Theorem 1 gap
    prefix_tokens = list(request.prefix.tokens) if request.prefix is not None else []
    code_tokens(source, request.model.vocab_size, prefix_tokens, request.tail, request.encoder,
                trace)
    kv, forwards = rebuild_kv(request.model, KV_SCHEDULE, request.tail, request.prefix,
                              request.prefilled)
    return EncodeOutput(trace, kv, [len(request.tail)], forwards)


def decode_model_free(source: ModelFreeLevel, model: CausalLM | None,
                      requests: Sequence[DecodeRequest]) -> list[DecodeOutput]:
    outputs = []
    for request in requests:
        trace = TraceColumns()
        prefix_tokens = list(request.prefix.tokens) if request.prefix is not None else []
        tail = decode_tokens(source, request.vocab_size, prefix_tokens, request.count,
                             request.decoder, trace)
        kv = None
        forwards = 0
        if request.with_kv:
            assert model is not None, "rebuilding the KV needs the model"
            kv, forwards = rebuild_kv(model, request.kv_schedule or KV_SCHEDULE, tail,
                                      request.prefix)
        outputs.append(DecodeOutput(tail, trace, kv, forwards))
    return outputs

"""What ``ngram`` and ``plain`` share: tokens coded without the model, KV by one chunked pass.

These levels code tokens under distributions computed in integer arithmetic from the tokens
alone, so their tokens decode identically on any machine with no model at all
(``seqkv.decompress_tokens``); the KV the residual is coded against comes from one float prefill
of the tokens, as the portable levels compute it (``seqkv.levels.kv_rebuild``); files of earlier
releases, whose KV came from the row-invariant forward, rebuild it on that schedule.

A level gives a ``TokenPredictor`` (``seqkv.coding.tables``); one loop each codes and decodes
under it, asking each position's table only for the shares it needs, so a decode costs what the
level's table costs per position (``ngram``: the tokens seen so far; ``plain``: one lookup), not
a table over the vocabulary.

Invariants:
1. A predictor's table for position i depends only on the tokens before it (enforced: the loops
   update the predictor with each token before asking for the next table).
2. Without ``with_kv`` a decode runs no model forward (enforced: ``model`` may be None); with
   it, the decoded tokens are checked (``DecodeRequest.check_tokens``) before the KV prefill, so
   a forged count costs no forward over tokens that do not verify (enforced).
3. Work bound (``check_model_free_decode``, before any table is built): a decode of
   ``count`` tokens from a guarded code (``seqkv.coding.arithmetic`` invariants 5 and 7) of
   ``num_bits`` bits is refused when every table of the level gives each token at least
   ``least_symbol_bits`` and ``count`` of them exceed ``num_bits + OVERRUN_BITS + 2``: the
   guard would refuse it later (``plain``: ``log2 V`` bits a token). Where a table can give a
   token a probability near 1 (``ngram`` after a run of one token), that bound is near 0 bits
   and the count is bounded by the caps instead: without the model, ``decode_work`` within
   ``MAX_MODEL_FREE_WORK`` (checked here) and the count within the caller's token limit
   (checked by the caller before this: ``seqkv.codec.token_limit``, ``MODEL_FREE_MAX_TOKENS``
   unless the caller's ``max_tokens`` says otherwise; the store's tokens-only codec applies
   ``MODEL_FREE_MAX_TOKENS`` itself; both in ``seqkv.limits``, set so that the largest decode
   they allow fits the fuzz harness's 2 s budget: ``benchmarks/model_free_decode.py``); with
   it, the model's context (enforced; ``tests/test_work_bounds.py``,
   ``tests/test_decode_limits.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from seqkv.coding.arithmetic import (
    OVERRUN_BITS,
    ArithmeticDecoder,
    ArithmeticEncoder,
    BitStream,
    within_code,
)
from seqkv.coding.tables import TokenPredictor
from seqkv.errors import CodeExhaustedError, DecodeLimitError
from seqkv.levels.base import (
    DecodeOutput,
    DecodeRequest,
    EncodeOutput,
    EncodeRequest,
    LevelSpec,
    TraceColumns,
)
from seqkv.levels.kv_rebuild import rebuild_kv
from seqkv.limits import MAX_MODEL_FREE_WORK, MAX_POSITIONS
from seqkv.models.adapter import CausalLM
from seqkv.types import Schedule

# NOTE: the schedule these levels compute their KV on, and the one files of earlier releases
# did. One prefill restores a session in about the time of zstd -d + a prefill (the user's
# alternative); the row-invariant forward's chunks take several times that, its per-row
# attention calls most of it on long texts (reports/code_notes.md).
KV_SCHEDULE: Schedule = "prefill"
FORMER_KV_SCHEDULES: tuple[Schedule, ...] = ("rows",)


class ModelFreeLevel(ABC):
    """A level whose tables come from the tokens alone; subclasses define ``spec``,
    ``predictor``, ``least_symbol_bits`` and ``decode_work``."""

    @property
    @abstractmethod
    def spec(self) -> LevelSpec: ...

    @abstractmethod
    def predictor(self, vocab_size: int) -> TokenPredictor:
        """A predictor with no history (invariant 1)."""

    @abstractmethod
    def least_symbol_bits(self, vocab_size: int) -> float:
        """The least information a token takes from the code under any table of the level
        (``seqkv.coding.arithmetic.least_symbol_bits``; invariant 3)."""

    @abstractmethod
    def decode_work(self, vocab_size: int, positions: int, count: int) -> int:
        """An upper bound on the work of a decode of ``count`` tokens, the last of them at
        position ``positions - 1``, in the units of ``MAX_MODEL_FREE_WORK`` (invariant 3)."""

    def max_positions(self, vocab_size: int) -> int:
        """The most positions (prefix and tokens) the level's tables are defined for."""
        return MAX_POSITIONS

    def encode(self, request: EncodeRequest) -> EncodeOutput:
        return encode_model_free(self, request)

    def decode(self, model: CausalLM | None,
               requests: Sequence[DecodeRequest]) -> list[DecodeOutput]:
        return decode_model_free(self, model, requests)


def check_model_free_decode(level: ModelFreeLevel, vocab_size: int, positions: int, count: int,
                    code: BitStream, guarded: bool, capped: bool) -> None:
    """Invariant 3, before any table: refuse ``count`` tokens (``positions`` with the prefix)
    that the level's tables cannot reach, that a ``guarded`` code of ``code.num_bits`` bits
    cannot carry (``CodeExhaustedError``), or (``capped``: no model bounds the count) that
    ask more work than ``MAX_MODEL_FREE_WORK`` (``DecodeLimitError``)."""
    name = level.spec.name
    if positions > level.max_positions(vocab_size):
        raise DecodeLimitError(
            f"the {name} level's tables over {vocab_size:,} tokens reach at most "
            f"{level.max_positions(vocab_size):,} positions, not {positions:,}")
    least = level.least_symbol_bits(vocab_size)
    if guarded and not within_code(count, least, code.num_bits):
        raise CodeExhaustedError(
            f"a token code of {code.num_bits:,} bits cannot carry {count:,} tokens at the "
            f"{name} level, each at least {least:.4g} bits (with the decoder's "
            f"{OVERRUN_BITS}-bit slack): its token count is forged or its code damaged")
    if capped and level.decode_work(vocab_size, positions, count) > MAX_MODEL_FREE_WORK:
        raise DecodeLimitError(
            f"the file declares {count:,} tokens over a vocabulary of {vocab_size:,} at the "
            f"{name} level: more work than a model-free decode allows (max_tokens lower, or "
            "pass the model, whose context bounds it)")


def code_tokens(source: ModelFreeLevel, vocab_size: int, prefix_tokens: Sequence[int],
                tail: Sequence[int], encoder: ArithmeticEncoder, trace: TraceColumns) -> None:
    """The model-free coding loop, the one every user of these levels runs (the codec's
    encode, and the store's tokens-only codec, ``seqkv.store.codecs.TokensCodec``)."""
    predictor = source.predictor(vocab_size)
    for token in prefix_tokens:
        predictor.update(token)
    for token in tail:
        table = predictor.table()
        start, end = table.interval(token)
        encoder.encode_interval(start, end)
        trace.record_share(table, token, start, end)
        predictor.update(token)


def decode_tokens(source: ModelFreeLevel, vocab_size: int, prefix_tokens: Sequence[int],
                  count: int, decoder: ArithmeticDecoder, trace: TraceColumns) -> list[int]:
    """The model-free decoding loop (invariant 1)."""
    predictor = source.predictor(vocab_size)
    for token in prefix_tokens:
        predictor.update(token)
    tail: list[int] = []
    for _ in range(count):
        table = predictor.table()
        token, start, end = table.locate(decoder.target())
        decoder.consume(start, end)
        tail.append(token)
        trace.record_share(table, token, start, end)
        predictor.update(token)
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
        trace = TraceColumns(figures=request.with_figures)
        prefix_tokens = list(request.prefix.tokens) if request.prefix is not None else []
        tail = decode_tokens(source, request.vocab_size, prefix_tokens, request.count,
                             request.decoder, trace)
        kv = None
        forwards = 0
        if request.with_kv:
            if request.check_tokens is not None:
                request.check_tokens(tail)  # invariant 2: before the prefill
            assert model is not None, "rebuilding the KV needs the model"
            kv, forwards = rebuild_kv(model, request.kv_schedule or KV_SCHEDULE, tail,
                                      request.prefix)
        outputs.append(DecodeOutput(tail, trace, kv, forwards))
    return outputs

"""The ``portable`` level: tokens coded under the integer predictor, decodable on any machine.

The model's float probabilities depend on the computation schedule, the batch shape, the thread
count, the CPU's kernels and the device, so a float-coded file decodes only where it was coded.
``seqkv.models.integer`` evaluates the same model with integer arithmetic for every reduction:
its logits, and the tables built from them (``integer_tables``), are the same bits for a full
prefill, token-by-token steps, any chunking, any batch and any machine. Coding under them buys:

* encoding at prefill speed: one batched integer forward over the whole text;
* decoding that batches any mix of sessions, with exact speculation: the spare rows of each
  forward check drafted tokens (prompt lookup over the decoded text), and a drafted row is the
  encoder's row whenever the drafts before it were right;
* tokens that decode on any machine with the same weights, tokenizer and predictor version.

The KV is restored by one float prefill of the decoded tokens (continuing the shared prefix's
stored KV when there is one), with the caller's residual applied. It is bit-exact on the
encoder's execution profile (the ``prefill`` schedule); elsewhere the decoder returns the
recomputed KV with ``kv_exact = False`` (``seqkv.codec``). Coded without the caller's KV
(``compress(..., kv=None)``), the file records no KV at all (format 4's flag): the coding runs no
float model, and every decoder reports its recomputed KV unverified (``kv_exact = False``).

``portable:N`` runs only the first N layers (then the final norm and head): less compute per
token, more bits per token (on SmolLM2-135M the bits cost more than the compute saves).

``portable+mix`` codes under the integer predictor's table mixed, exactly, with a mixing
dictionary's predictors and the session's own (``seqkv.mixing``): below the model's own
cross-entropy where sessions quote content the dictionary holds, never more than the mixer's
stated regret above the predictor elsewhere. The trace records the predictor's own
log2-probabilities beside the mixed table's costs.

Invariants:
1. Encoder and decoder see the same integer rows (enforced by the integer forward's
   construction; tested across chunkings, batches and threads in tests/test_integer_*.py).
2. A stream decodes a drafted row only after every draft before it was confirmed (enforced).
3. The first token is coded after the start token (or after the prefix), as at every level.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch

from seqkv.coding.arithmetic import ArithmeticDecoder
from seqkv.coding.frequencies import CumulativeTable, uniform_distribution
from seqkv.errors import InvalidLevelError
from seqkv.levels.base import (
    DecodeOutput,
    DecodeRequest,
    EncodeOutput,
    EncodeRequest,
    LevelSpec,
    TraceColumns,
)
from seqkv.levels.drafts import PromptLookup
from seqkv.levels.kv_rebuild import prefill_kv
from seqkv.levels.layer_drafts import DraftCounts, LayerDrafter, LookupDrafter, StreamDrafter
from seqkv.limits import MAX_LAYERS
from seqkv.mixing.dictionary import Dictionary
from seqkv.mixing.mixer import MixingPredictor
from seqkv.models.adapter import CausalLM
from seqkv.models.integer.blocks import BlockWeights, block_weights
from seqkv.models.integer.forward import IntegerForward, IntSequence
from seqkv.models.integer.table import (
    IntegerTables,
    TableBuffers,
    integer_table,
    integer_tables,
)
from seqkv.models.integer.threads import ThreadPolicy, decode_policy
from seqkv.models.integer.weights import IntegerWeights, integer_weights
from seqkv.schedule import pinned_threads
from seqkv.session import Prefix

# NOTE: rows per encoder forward, and rows per batch of tables: the tables of 64 rows hold
# 64 x 49,153 int64 counts (25 MB); a forward of 256 rows runs near prefill speed.
ENCODE_CHUNK_ROWS = 256
TABLE_ROWS = 64
# NOTE: a lone stream drafts up to this many tokens per forward: the integer forward has no
# padding to fill, so each draft costs its row; prompt lookup's hits come in runs of a few.
MAX_DRAFT = 7
# NOTE: drafts only after a repeated 3-gram. With native.c a drafted row costs a fraction of a
# one-row forward, but single-token matches rarely continue, so drafting after any 1-gram match
# decodes slower than after 2- or 3-grams on prose and on code (reports/code_notes.md).
DRAFT_MIN_NGRAM = 3
BATCH_GROUP = "integer-forward"
# NOTE: the integer forward's rows are the same on any thread count. Its torch path runs on one
# thread: on two, a one-row step stalls by whole scheduler slices while another process keeps
# the second core busy (torch._int_mm's OpenMP workers wait on each other). native.c shares
# each layer's output blocks dynamically, so a delayed thread takes fewer; an encode (forwards
# of up to 256 rows) runs on two, which beat one on a quiet machine. A decode's one-row steps
# wait at every region for a descheduled thread, so each decode measures which count is faster
# (``models/integer/threads.py``).
TORCH_PATH_THREADS = 1
NATIVE_THREADS = 2


def integer_threads(engine: IntegerForward) -> int:
    """The thread count the integer forward runs on (see the note above)."""
    return NATIVE_THREADS if engine.backend == "native" else TORCH_PATH_THREADS


# NOTE: encode buffers kept per model for this many encodes running at once (more allocate
# their own and drop them). A set is the logits of a 256-row forward and 64 rows of tables
# (100 + 50 MB on SmolLM2): numpy asks for transparent huge pages for arrays this large, and a
# fresh set costs its faults and zeroing on every encode, most in a process whose memory other
# work has fragmented (reports/code_notes.md).
KEPT_BUFFER_SETS = 2


@dataclass
class _EncodeBuffers:
    logits: npt.NDArray[np.int64]  # [ENCODE_CHUNK_ROWS, V]: one forward's rows
    tables: TableBuffers  # TABLE_ROWS rows of tables


class _BufferPool:
    """Encode buffers of one vocabulary size, lent to one encode at a time (thread-safe)."""

    def __init__(self, vocab: int) -> None:
        self._vocab = vocab
        self._free: list[_EncodeBuffers] = []
        self._lock = threading.Lock()

    @contextmanager
    def lend(self) -> Iterator[_EncodeBuffers]:
        with self._lock:
            buffers = self._free.pop() if self._free else None
        if buffers is None:
            buffers = _EncodeBuffers(
                np.empty((ENCODE_CHUNK_ROWS, self._vocab), dtype=np.int64),
                TableBuffers(TABLE_ROWS, self._vocab))
        try:
            yield buffers
        finally:
            with self._lock:
                if len(self._free) < KEPT_BUFFER_SETS:
                    self._free.append(buffers)


WeightBits = Literal[8, 4]  # int8 rows (portable) or Q4_1 blocks (portable4)


class IntegerPredictors:
    """The integer predictors of one model, by weight format and layer count, sharing one set
    of weights per format, and the buffers their encodes reuse."""

    def __init__(self, model: CausalLM, device: torch.device | str = "cpu") -> None:
        self._model = model
        self._device = torch.device(device)
        self._weights: IntegerWeights | None = None
        self._blocks: BlockWeights | None = None
        self._forwards: dict[tuple[WeightBits, int | None], IntegerForward] = {}
        self.encode_buffers = _BufferPool(model.vocab_size)

    def get(self, layers: int | None, bits: WeightBits = 8) -> IntegerForward:
        engine = self._forwards.get((bits, layers))
        if engine is None and bits == 4:
            if self._blocks is None:  # on the CPU, as the int8 weights below
                self._blocks = block_weights(self._model)
                if self._device.type != "cpu":
                    self._blocks = self._blocks.to(self._device)
            engine = IntegerForward(self._blocks, layers=layers)
            self._forwards[(bits, layers)] = engine
        if engine is None:
            if self._weights is None:
                # NOTE: built from the float weights' CPU copies and run on the CPU (native.c,
                # tested bit for bit against the torch statement) wherever the model runs. A
                # predictor on a GPU (the torch statement there, designed to give the same
                # integers but not yet run on one) is registered before first use with
                # model.derived(IntegerPredictors, lambda m: IntegerPredictors(m, "cuda")), as
                # benchmarks/portable_devices.py does to check it.
                self._weights = integer_weights(self._model)
                if self._device.type != "cpu":
                    self._weights = self._weights.to(self._device)
            engine = IntegerForward(self._weights, layers=layers)
            self._forwards[(bits, layers)] = engine
        return engine


def integer_predictor(model: CausalLM, layers: int | None = None,
                      bits: WeightBits = 8) -> IntegerForward:
    """The model's integer predictor (the first ``layers`` layers) on int8 rows (``bits=8``)
    or Q4_1 blocks (``bits=4``), built once per model."""
    if layers is not None and layers > model.num_layers:
        raise InvalidLevelError(f"{level_name(bits)}:{layers} asks for more layers than the "
                                f"model's {model.num_layers}")
    return model.derived(IntegerPredictors, IntegerPredictors).get(layers, bits)


def level_name(bits: WeightBits, mix: bool = False) -> str:
    """``portable``, ``portable+mix`` or ``portable4``: the level family of a weight format."""
    return "portable4" if bits == 4 else ("portable+mix" if mix else "portable")


# A coded position's table and log2-probabilities, with the row's entropy where the integer
# tables computed it (None: the uniform start, whose entropy the trace computes).
_Row = tuple[CumulativeTable, npt.NDArray[np.float64], float | None]


def compared_positions(prefix: Prefix | None, count: int) -> int:
    """The positions an encoder's and a decoder's predictor both hold after coding ``count``
    tokens: the prefix, then every coded token but the last, which the decoder never forwards
    (``EncodeOutput.predictor_digest``). A start token is not held: its row is computed once,
    apart (``IntegerForward.start_row``)."""
    held = len(prefix.tokens) if prefix is not None else 0
    return held + count - 1


def _row(tables: IntegerTables) -> _Row:
    return tables.cumulative, tables.log2p, float(tables.entropy)


def _uniform(vocab: int) -> _Row:
    table, log2p = uniform_distribution(vocab)
    return table, log2p, None


def _start(engine: IntegerForward, context: int | None,
           prefix: Prefix | None) -> tuple[IntSequence, _Row]:
    """A sequence holding the prefix (integer KV recomputed from its tokens) and the
    distribution of the first coded token."""
    sequence = engine.new_sequence()
    if prefix is not None:
        tokens = list(prefix.tokens)
        last: npt.NDArray[np.int64] | None = None
        for start in range(0, len(tokens), ENCODE_CHUNK_ROWS):
            last = engine.forward([(sequence, tokens[start : start + ENCODE_CHUNK_ROWS])])[0][-1]
        assert last is not None
        return sequence, _row(integer_table(last))
    if context is None:
        return sequence, _uniform(engine.vocab_size)
    return sequence, _row(integer_table(engine.start_row(context)))


@dataclass(frozen=True)
class PortableLevel:
    """The integer predictor's level (``portable``), or its first ``layers`` layers, optionally
    mixed with a dictionary (``portable+mix``); on Q4_1 weight blocks with ``bits=4``
    (``portable4``, ``portable4:N``)."""

    layers: int | None = None
    mix: bool = False
    bits: WeightBits = 8

    def __post_init__(self) -> None:
        if self.layers is not None and not 1 <= self.layers <= MAX_LAYERS:
            raise InvalidLevelError(f"{level_name(self.bits)}:N takes 1 to {MAX_LAYERS} layers, "
                                    f"not {self.layers}")
        if self.mix and self.bits != 8:
            raise InvalidLevelError("portable+mix mixes the int8 predictor only")

    @property
    def spec(self) -> LevelSpec:
        name = level_name(self.bits, self.mix)
        name = name if self.layers is None else f"{name}:{self.layers}"
        return LevelSpec(
            name, model_coded=True, schedule="prefill",
            decoding="one integer forward per token or fewer (drafts), sessions batched, on "
                     "any machine; one float prefill for the KV",
            reference="model" if self.layers is None else "none",
            batch_group=self.batch_group, portable=True, mixes=self.mix,
            reference_allowance=PORTABLE_ALLOWANCE)

    @property
    def batch_group(self) -> str:
        """Files decode together where they run the same integer predictor (``portable`` and
        ``portable+mix`` do; ``portable:N`` and ``portable4`` each run their own)."""
        if (self.bits, self.layers) == (8, None):
            return BATCH_GROUP
        return f"{BATCH_GROUP}:{level_name(self.bits)}:{self.layers}"

    def engine(self, model: CausalLM) -> IntegerForward:
        """This level's integer predictor of ``model``."""
        return integer_predictor(model, self.layers, self.bits)

    def encode(self, request: EncodeRequest) -> EncodeOutput:
        engine = self.engine(request.model)
        with pinned_threads(integer_threads(engine)):
            trace, forwards, digest = self._code(request)
        kv = (prefill_kv(request.model, request.tail, request.prefix, request.prefilled)
              if request.with_kv else None)
        return EncodeOutput(trace, kv, [len(request.tail)], forwards, digest)

    def _mixer(self, vocab: int, dictionary: Dictionary | None,
               prefix: Prefix | None) -> MixingPredictor | None:
        if not self.mix:
            if dictionary is not None:
                raise InvalidLevelError(f"level {self.spec.name!r} takes no dictionary: code at "
                                        "portable+mix to use one")
            return None
        mixer = MixingPredictor(dictionary, vocab)
        if prefix is not None:
            mixer.prime(prefix.tokens)
        return mixer

    def _code(self, request: EncodeRequest) -> tuple[TraceColumns, int, str]:
        engine = self.engine(request.model)
        mixer = self._mixer(engine.vocab_size, request.dictionary, request.prefix)
        sequence, first = _start(engine, request.context, request.prefix)
        forwards = 1 if request.prefix is not None or request.context is not None else 0
        # one buffer of logits and one of tables, kept from encode to encode (KEPT_BUFFER_SETS)
        pool = request.model.derived(IntegerPredictors, IntegerPredictors).encode_buffers
        with pool.lend() as buffers:
            trace, forwards = self._code_chunks(request, engine, sequence, first, mixer, buffers,
                                                forwards)
        held = compared_positions(request.prefix, len(request.tail))
        return trace, forwards, sequence.digest(held)

    def _code_chunks(self, request: EncodeRequest, engine: IntegerForward,
                     sequence: IntSequence, first: _Row, mixer: MixingPredictor | None,
                     buffers: _EncodeBuffers, forwards: int) -> tuple[TraceColumns, int]:
        tail = request.tail
        trace = request.new_trace()
        table, log2p, entropy = first
        position = 0
        for start in range(0, len(tail), ENCODE_CHUNK_ROWS):
            chunk = tail[start : start + ENCODE_CHUNK_ROWS]
            rows = engine.forward([(sequence, chunk)], out=buffers.logits)[0]  # [len(chunk), V]
            forwards += 1
            for offset in range(0, len(chunk), TABLE_ROWS):
                tables, log2ps, entropies = integer_tables(rows[offset : offset + TABLE_ROWS],
                                                           buffers.tables)
                for row in range(tables.shape[0]):
                    token = tail[position]
                    coded = table if mixer is None else mixer.table(table)
                    request.encoder.encode(coded, token)
                    trace.record(log2p, coded, token, entropy)
                    if mixer is not None:
                        mixer.update(token)
                    table, log2p, entropy = tables[row], log2ps[row], float(entropies[row])
                    position += 1
                # the next token's table outlives the buffers' next filling
                table, log2p = table.copy(), log2p.copy()
        return trace, forwards

    def decode(self, model: CausalLM | None,
               requests: Sequence[DecodeRequest]) -> list[DecodeOutput]:
        assert model is not None, "the portable level needs the model's weights"
        return self.decode_drafted(model, requests)

    def decode_drafted(self, model: CausalLM, requests: Sequence[DecodeRequest],
                       drafter: StreamDrafter | None = None,
                       counts: DraftCounts | None = None) -> list[DecodeOutput]:
        """``decode`` with a chosen drafter (default prompt lookup) and its counts: the same
        tokens whatever the drafter (invariant 2)."""
        engine = self.engine(model)
        policy = decode_policy(engine.backend == "native")
        with pinned_threads(policy.first()):  # the context's forward: as many as fit now
            streams = [_Stream.start(engine, request, self._mixer(
                engine.vocab_size, request.dictionary, request.prefix)) for request in requests]
        forwards = decode_streams(engine, streams, drafter, counts, policy)
        outputs = []
        for request, stream in zip(requests, streams, strict=True):
            kv = prefill_kv(model, stream.tokens, request.prefix) if request.with_kv else None
            digest = stream.sequence.digest(compared_positions(request.prefix, request.count))
            outputs.append(DecodeOutput(stream.tokens, stream.trace, kv, forwards, digest))
        return outputs

    def layer_drafter(self, model: CausalLM, layers: int, max_draft: int,
                      after_lookup: bool = True) -> LayerDrafter:
        """Self-drafting for this level's files: the first ``layers`` layers of its own
        integer predictor (``layer_drafts``), tried after prompt lookup by default."""
        full = self.layers if self.layers is not None else model.num_layers
        if not 1 <= layers < full:
            raise InvalidLevelError(f"a draft runs 1 to {full - 1} of the level's {full} "
                                    f"layers, not {layers}")
        return LayerDrafter(integer_predictor(model, layers, self.bits), max_draft,
                            default_drafter() if after_lookup else None)


# NOTE: the integer predictor's code is measured at most 1% above the float model's
# cross-entropy on the shipped texts (tests/test_integer_*.py, benchmarks/integer_predictor.py);
# every run checks it within 3%, a margin of 3x.
PORTABLE_ALLOWANCE = 0.03


@dataclass
class _Stream:
    """One file being decoded: its sequence, decoded tokens, next distribution."""

    sequence: IntSequence
    decoder: ArithmeticDecoder
    length: int
    context: list[int]  # what the drafts may copy from: the prefix, then the decoded tokens
    distribution: _Row
    mixer: MixingPredictor | None = None
    tokens: list[int] = field(default_factory=list)
    trace: TraceColumns = field(default_factory=TraceColumns)

    @classmethod
    def start(cls, engine: IntegerForward, request: DecodeRequest,
              mixer: MixingPredictor | None) -> _Stream:
        sequence, first = _start(engine, request.context, request.prefix)
        prefix = list(request.prefix.tokens) if request.prefix is not None else []
        return cls(sequence, request.decoder, request.count, prefix, first, mixer,
                   trace=request.new_trace())

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.length

    def take(self, distribution: _Row) -> int:
        table, log2p, entropy = distribution
        coded = table if self.mixer is None else self.mixer.table(table)
        token = self.decoder.decode(coded)
        self.tokens.append(token)
        self.context.append(token)
        self.trace.record(log2p, coded, token, entropy)
        if self.mixer is not None:
            self.mixer.update(token)
        return token


def default_drafter() -> StreamDrafter:
    """Prompt lookup after a repeated 3-gram (``DRAFT_MIN_NGRAM``), up to ``MAX_DRAFT``."""
    return LookupDrafter(PromptLookup(max_draft=MAX_DRAFT, min_ngram=DRAFT_MIN_NGRAM))


def decode_streams(engine: IntegerForward, streams: Sequence[_Stream],
                   drafter: StreamDrafter | None = None,
                   counts: DraftCounts | None = None,
                   policy: ThreadPolicy | None = None) -> int:
    """Decode every stream, one shared integer forward per round; return the forwards run.

    Each round forwards every unfinished stream's last token and, for a lone stream, its
    drafted continuation (``drafter``, default prompt lookup); row ``r`` of a stream is the
    encoder's distribution after input ``r`` while inputs ``0..r`` are right, so the stream
    decodes rows until a decoded token differs from its draft. ``counts`` (optional) receives
    the drafts verified and confirmed. Each forward runs on the thread count ``policy``
    (default ``threads.decode_policy``) chooses: the rows are the same on any count.
    """
    drafter = default_drafter() if drafter is None else drafter
    counts = DraftCounts() if counts is None else counts
    policy = decode_policy(engine.backend == "native") if policy is None else policy
    for stream in streams:
        if stream.length:
            stream.take(stream.distribution)
    forwards = 0
    while True:
        active = [s for s in streams if not s.done]
        if not active:
            return forwards
        # NOTE: no guess past the stream's last token: its row would never be decoded
        guesses = [drafter.guess(s.context, s.sequence, min(MAX_DRAFT, s.length -
                                                           len(s.tokens) - 1), counts)
                   if len(active) == 1 else [] for s in active]
        calls = [(s.sequence, [s.tokens[-1], *guess]) for s, guess in zip(active, guesses,
                                                                          strict=True)]
        # NOTE: the round's tables run on the chosen count too: native.c builds them with
        # OpenMP, and a 2-thread table step stalls under load as a forward does
        # (benchmarks/decode_under_load.py)
        threads = policy.choose()
        start = time.perf_counter()
        with pinned_threads(threads):
            rows = engine.forward(calls)
            for stream, guess, stream_rows in zip(active, guesses, rows, strict=True):
                _take_rows(stream, guess, stream_rows, counts)
        if not any(guesses):  # like for like: one row per stream (threads.py, invariant 2)
            policy.record(threads, time.perf_counter() - start)
        forwards += 1
        counts.rounds += 1


def _take_rows(stream: _Stream, guess: Sequence[int], stream_rows: npt.NDArray[np.int64],
               counts: DraftCounts) -> None:
    """Decode ``stream``'s rows of one round until a decoded token differs from its draft;
    crop its sequence to the inputs that were right."""
    before = stream.sequence.length - len(stream_rows)
    kept = 0
    for r in range(len(stream_rows)):
        kept = r + 1
        token = stream.take(_row(integer_table(stream_rows[r])))
        confirmed = r < len(guess) and guess[r] == token
        counts.accepted += confirmed
        if stream.done or not confirmed:
            break
    counts.drafted += len(guess)
    stream.sequence.crop(before + kept)

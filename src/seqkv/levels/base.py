"""What a coding level is: the Protocol every level implements, and what passes through it.

A level decides how a session's tokens become arithmetic-code symbols and back: under which
distributions (the model's, an adaptive count model's, the uniform one), computed along which
schedule, and how the decoder rebuilds the KV the residual is coded against. The codec
(``seqkv.codec``) orchestrates any level the same way: it hands the level an arithmetic encoder
and the tokens (``EncodeRequest``), stores what comes back (``EncodeOutput``), and on decode hands
every file of that level to ``decode`` at once, so a level that can share forwards between files
does.

Invariants:
1. ``decode`` returns, for each request, the tokens the encoder coded, with the same per-position
   trace, or tokens that the codec's checksum then refuses (enforced by the codec).
2. ``EncodeOutput.kv`` is bit for bit the KV a decode of the same file with ``with_kv`` rebuilds
   on the same execution profile (enforced per level; tested for every level).
3. A level's name, as ``spec.name``, is what the file records; ``seqkv.levels.parse_level`` turns
   it back into the level (enforced: tested for every registered level).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
import torch

from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder
from seqkv.coding.frequencies import CumulativeTable, symbol_cost_bits, table_and_log2p
from seqkv.coding.tables import PositionTable, cost_bits
from seqkv.mixing.dictionary import Dictionary
from seqkv.models.adapter import CausalLM
from seqkv.progress import ProgressSink
from seqkv.session import Prefix
from seqkv.types import Schedule

Distribution = tuple[CumulativeTable, npt.NDArray[np.float64]]
"""The coder's table for one position and the float log2-probabilities it was built from."""


def model_distribution(logits: npt.NDArray[np.floating]) -> Distribution:
    """The coder's table and log2-probabilities of one row of the model's logits: the one place
    where every model-coded level turns the model's output into what it codes under."""
    return table_and_log2p(logits)


@dataclass(frozen=True)
class LevelSpec:
    """What a level is, for users choosing one and for the codec dispatching to it."""

    name: str  # as written on the command line and in the file: "tokens", "segments:8", ...
    model_coded: bool  # decoding the tokens needs the model's probabilities
    schedule: Schedule  # the profile its probabilities (or its KV recomputation) depend on
    decoding: str  # what decoding costs, in words
    # What every run checks the code length against, besides the coder's own tables
    # (``seqkv.bounds``): the model's cross-entropy recomputed by one prefill per segment, the
    # uniform code, or nothing independent (an adaptive integer model a recount would only rerun).
    reference: Literal["model", "uniform", "none"] = "model"
    # A fraction of the reference the code may exceed it by, beyond the per-token allowance:
    # 0 where the level codes under the model's own float probabilities.
    reference_allowance: float = 0.0
    # Levels with the same batch group decode each other's files together in shared forwards
    # (any of them takes the whole group's requests); None: files decode one by one.
    batch_group: str | None = None
    # The tokens decode on any machine (no float probabilities involved); only the KV depends
    # on the execution profile, and is reported inexact elsewhere instead of refused.
    portable: bool = False
    # The level mixes the model with a dictionary's predictors (``seqkv.mixing``): it takes a
    # dictionary, and every run also checks that mixing cost at most its stated regret.
    mixes: bool = False
    # Schedules the level's files of earlier releases computed their KV on: a decoder whose
    # profile on one of them is the file's rebuilds the KV on it (``seqkv.codec.kv_schedule``).
    former_schedules: tuple[Schedule, ...] = ()


KVClasses = tuple[npt.NDArray[np.int64], ...]
"""A model's KV-collision classes as index arrays (``seqkv.models.collisions``)."""


def kv_gap_bits(log2p: npt.NDArray[np.float64], classes: KVClasses) -> float:
    """H(t | prefix) - H(KV | prefix) at one position, exactly: the entropy within each class of
    ids whose KV is identical, weighted by the class's mass (0 when there are no classes)."""
    gap = 0.0
    for ids in classes:
        log2 = log2p[ids]
        mass = np.exp2(log2)
        total = float(mass.sum())
        if total > 0.0:
            inner = float(-(mass * np.where(mass > 0, log2, 0.0)).sum())
            gap += inner + total * float(np.log2(total))
    return max(gap, 0.0)


@dataclass
class TraceColumns:
    """Per-position figures (see ``seqkv.codec.CodingTrace``), filled in any order.

    ``with_entropy`` False skips the entropies (a sum over the vocabulary per position, a large
    share of a model-free put at V = 49,152): surprisal and table cost stay, which the bounds need.
    ``classes`` (the model's KV-collision classes, possibly none) adds Theorem 1's exact gap per
    position; None (a level whose tables are not the model's) records no gap.
    """

    surprisal: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    kv_gap: list[float] = field(default_factory=list)
    with_entropy: bool = True
    classes: KVClasses | None = None
    # False: ``record_share`` records nothing (a tokens-only decode, whose figures nobody reads)
    figures: bool = True

    def record(self, log2p: npt.NDArray[np.float64], table: CumulativeTable, token: int,
               entropy: float | None = None) -> None:
        """One coded position; ``entropy`` where the level has it already (the integer
        tables', ``seqkv.models.integer.table``), else computed from ``log2p``."""
        self.surprisal.append(-float(log2p[token]))
        self.cost.append(symbol_cost_bits(table, token))
        if self.classes is not None:
            self.kv_gap.append(kv_gap_bits(log2p, self.classes))
        if not self.with_entropy:
            return
        if entropy is None:
            # NOTE: not np.dot: it wakes OpenBLAS threads that slow the pinned torch thread 2x.
            entropy = -float((np.exp2(log2p) * log2p).sum())
        self.entropy.append(entropy)

    def record_share(self, table: PositionTable, token: int, start: int, end: int) -> None:
        """One position coded under a table of another form than a dense array (a model-free
        level's: no KV gap), ``[start, end)`` the token's share."""
        assert self.classes is None, "a model-free table has no KV-collision gap"
        if not self.figures:
            return
        self.surprisal.append(table.surprisal(token))
        self.cost.append(cost_bits(start, end))
        if self.with_entropy:
            self.entropy.append(table.entropy())

    def extend(self, other: TraceColumns) -> None:
        self.surprisal += other.surprisal
        self.cost += other.cost
        self.entropy += other.entropy
        self.kv_gap += other.kv_gap


@dataclass
class EncodeRequest:
    """One session's tail to code after its shared prefix (if any)."""

    model: CausalLM
    tail: list[int]
    prefix: Prefix | None
    context: int | None  # the start token the first token is coded after (no prefix)
    encoder: ArithmeticEncoder
    progress: ProgressSink | None = None
    dictionary: Dictionary | None = None  # for levels that mix (``portable+mix``)
    # Whether the file records the KV the decoder rebuilds. A portable level computes that KV
    # only for it (one float prefill); other levels have it from coding and always return it.
    with_kv: bool = True
    classes: KVClasses | None = None  # the model's KV-collision classes (Theorem 1's gap)
    # [layers, 2, kv_heads, tail, head_dim]: ``CausalLM.prefill`` over the tail (no prefix),
    # which the codec ran already for the caller's KV; a level whose KV is that prefill (the
    # ``prefill`` schedule) takes it instead of running it again (``seqkv.levels.kv_rebuild``)
    prefilled: torch.Tensor | None = None

    def new_trace(self) -> TraceColumns:
        return TraceColumns(classes=self.classes)


@dataclass(frozen=True)
class EncodeOutput:
    trace: TraceColumns
    # [layers, 2, kv_heads, prefix + tail, head_dim]: what the decoder rebuilds; None only where
    # the request asked for no KV and the level computes it for the file alone (portable)
    kv: torch.Tensor | None
    segments: list[int]  # segment lengths, in coding order
    forwards: int  # model forwards run (a start row served from a cache counts as one)
    # The integer predictor's KV digest over the positions both coder sides hold (the prefix or
    # start, then every coded token but the last): portable levels only
    predictor_digest: str | None = None


@dataclass
class DecodeRequest:
    """One file's token code and what the level needs to decode it."""

    decoder: ArithmeticDecoder
    count: int
    segments: list[int]
    context: int | None
    vocab_size: int
    prefix: Prefix | None
    with_kv: bool = True  # also rebuild the KV (False: tokens only)
    progress: ProgressSink | None = None
    dictionary: Dictionary | None = None  # the one the file was coded with
    classes: KVClasses | None = None  # the model's KV-collision classes (Theorem 1's gap)
    # The schedule to rebuild the KV on: the level's own (None) or one of its former schedules,
    # as the file's execution profile names it (``seqkv.codec.kv_schedule``)
    kv_schedule: Schedule | None = None
    # Verifies the decoded tail (raising on a mismatch) where a level has its tokens before its
    # KV work: called before that work, so tokens that do not verify cost no prefill
    check_tokens: Callable[[Sequence[int]], None] | None = None
    # False: the caller reads no trace (a tokens-only decode); a level may then record none
    with_figures: bool = True

    def new_trace(self) -> TraceColumns:
        return TraceColumns(classes=self.classes)


@dataclass(frozen=True)
class DecodeOutput:
    tail: list[int]
    trace: TraceColumns
    kv: torch.Tensor | None  # None when the request did not ask for it
    forwards: int  # files decoded together share their forwards; each reports the total
    predictor_digest: str | None = None  # as ``EncodeOutput.predictor_digest``


class CodingLevel(Protocol):
    """One point of the rate-compute dial (see ``seqkv.levels``)."""

    @property
    def spec(self) -> LevelSpec: ...

    def encode(self, request: EncodeRequest) -> EncodeOutput: ...

    def decode(self, model: CausalLM | None,
               requests: Sequence[DecodeRequest]) -> list[DecodeOutput]:
        """Decode every request; ``model`` may be None only for a level that is not
        model-coded and requests without ``with_kv``."""
        ...


def segment_order(lengths: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(segment, index in segment) in coding order: round by round, segment by segment."""
    for step in range(max(lengths, default=0)):
        for segment, length in enumerate(lengths):
            if step < length:
                yield segment, step

"""The coded token stream shared by every schedule: who codes a position, and what it cost.

A schedule (``speculative``, ``blocked``) decides *which logit row* codes each position; this
module does the coding. The encoder side knows the tokens and writes them, the decoder side
reads them; both expose the same ``code(position, row)`` call, so a schedule written once
against ``TokenCoder`` runs identically on both sides.

Invariants:
1. Position 0 is coded under ``first_token_distribution`` (the start token's distribution, or
   uniform); position ``i >= 1`` under the row of token ``i - 1`` that the schedule chose
   (enforced by the schedules, checked by the round-trip tests).
2. ``TokenCoder.code`` must be called for positions 0, 1, 2, ... in order, exactly once each
   (enforced: it raises ``RuntimeError`` otherwise, an internal error of a schedule).
3. The code length is at most ``ideal_code_bits + 2`` and ``ideal_code_bits`` at most the
   cross-entropy of the rows used plus 1.7e-5 bits per token (``seqkv.coding``; checked by the
   tests).
4. The decoder returns some token for any bit string (``seqkv.coding.arithmetic``): callers
   verify a checksum of the result before trusting it (assumed; ``seqkv.codec`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from transformers import DynamicCache

from research.decoding.forward import first_token_distribution
from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder, BitStream
from seqkv.coding.frequencies import (
    CumulativeTable,
    symbol_cost_bits,
    table_and_log2p,
)
from seqkv.models.adapter import CausalLM


@dataclass(frozen=True)
class ScheduleStats:
    """What a schedule cost: its forwards, the positions they computed, the guesses that held.

    ``forwards`` counts the session's forwards; the start token's one-position forward is not
    counted (every schedule pays it once).
    """

    tokens: int
    forwards: int
    rows: int  # positions computed over all forwards (recomputed and rejected ones included)
    drafted: int  # guessed positions forwarded
    accepted: int  # guesses the decoded tokens confirmed
    forward_lengths: tuple[int, ...] = ()  # positions of each forward, in order

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.forwards if self.forwards else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class CodedStream:
    """An encoder's output: the bits, and the exact and ideal costs of the rows it used.

    ``cache`` is the encoder's own final cache (not part of the stream): the KV a decoder must
    reproduce, for a checksum or a residual. ``blocks`` is the block partition of a blocked
    stream (side information a file would store; empty for the other schedules).
    """

    code: BitStream
    count: int
    first_token_context: int | None
    cross_entropy_bits: float  # sum of -log2 p(token) under the float rows used
    ideal_code_bits: float  # the same under the integer frequency tables
    stats: ScheduleStats
    cache: DynamicCache
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class DecodedStream:
    """A decoder's output: the tokens and the session's cache (``count`` positions)."""

    tokens: list[int]
    cache: DynamicCache
    cross_entropy_bits: float
    ideal_code_bits: float
    stats: ScheduleStats


class TokenCoder:
    """Codes positions in order on one side of the stream, and tallies their cost."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.tokens: list[int] = []
        self.cross_entropy_bits = 0.0
        self.ideal_code_bits = 0.0

    def _code(self, position: int, table: CumulativeTable) -> int:
        raise NotImplementedError

    def code_table(
        self, position: int, table: CumulativeTable, log2p: npt.NDArray[np.float64]
    ) -> int:
        """Code ``position`` under ``table``; return its token."""
        if position != len(self.tokens) or position >= self.count:
            raise RuntimeError(
                f"schedule error: coded position {position} after {len(self.tokens)} "
                f"of {self.count}"
            )
        token = self._code(position, table)
        self.tokens.append(token)
        self.cross_entropy_bits -= float(log2p[token])
        self.ideal_code_bits += symbol_cost_bits(table, token)
        return token

    def code(self, position: int, row: npt.NDArray[np.float32]) -> int:
        """Code ``position`` under one logit row (the row of token ``position - 1``)."""
        return self.code_table(position, *table_and_log2p(row))

    def code_first(self, model: CausalLM, context: int | None) -> int:
        """Code position 0 under the start token's distribution (or uniformly)."""
        table, log2p = first_token_distribution(model, context)
        return self.code_table(0, table, log2p)


class EncodingCoder(TokenCoder):
    """The encoder's side: writes the known token at each position."""

    def __init__(self, tokens: Sequence[int]) -> None:
        super().__init__(len(tokens))
        self._known = list(tokens)
        self._encoder = ArithmeticEncoder()

    def _code(self, position: int, table: CumulativeTable) -> int:
        token = self._known[position]
        self._encoder.encode(table, token)
        return token

    def finish(self) -> BitStream:
        return self._encoder.finish()


class DecodingCoder(TokenCoder):
    """The decoder's side: reads each position's token from the bits."""

    def __init__(self, code: BitStream, count: int) -> None:
        super().__init__(count)
        self._decoder = ArithmeticDecoder(code)

    def _code(self, position: int, table: CumulativeTable) -> int:
        return self._decoder.decode(table)

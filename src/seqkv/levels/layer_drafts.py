"""Self-drafting: the first N layers of a stream's own integer predictor guess its next tokens.

A portable decoder verifies drafted tokens for free where the forward has spare rows: a forward
of ``1 + k`` rows gives the encoder's distribution at every row whose inputs were right
(``portable.decode_streams``). Prompt lookup (``drafts.PromptLookup``) drafts only where the
text repeats itself. Here the drafts come from the model itself, cut short (as in LayerSkip,
Elhoushi et al. 2024, and Draft & Verify, Zhang et al. 2023): the integer predictor's first N
layers, then the model's own final norm and head, run greedily for up to ``max_draft`` tokens;
the full predictor then verifies them in one forward, and the arithmetic decoder consumes only
the verified rows.

The drafts share the stream's integer KV pool: the first N layers' keys and values of the
decoded tokens are the full predictor's (the same integers, ``forward.py`` invariant 1), so a
draft step computes N layers for one new row and nothing else; the drafted positions are
cropped again before the full predictor's forward writes those positions in every layer.

Measured (``benchmarks/self_drafting.py``, ``reports/self_drafting.md``): on SmolLM2-135M
without a trained exit head, the first N layers' greedy token is the text's next token at
1-8% of positions for N <= 16 and 19-27% at N = 24, against the full model's own 35-70%, and a
draft step costs N layers plus the whole head; self-drafting decodes slower than prompt lookup
alone on every kind measured. ``decode_streams`` therefore keeps prompt lookup as its default.

Invariants:
1. A drafter never changes a decoded token: the decoder decodes only the full predictor's rows,
   and a drafted row only after every draft before it was confirmed (enforced by
   ``decode_streams``; tested against prompt-lookup decoding).
2. ``LayerDrafter.guess`` returns the sequence as it found it: same length, and every held
   position's keys and values unchanged (enforced: it writes only positions at or after the
   sequence's length, then crops them).
3. ``guess`` returns at most ``limit`` valid token ids (enforced: argmax over the vocabulary).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from seqkv.errors import InvalidLevelError
from seqkv.levels.drafts import DraftPolicy
from seqkv.models.integer.forward import IntegerForward, IntSequence


@dataclass
class DraftCounts:
    """What drafting did over a decode (filled by ``portable.decode_streams``)."""

    rounds: int = 0  # forwards of the full predictor
    drafted: int = 0  # drafted tokens those forwards verified
    accepted: int = 0  # drafted tokens the decoded tokens confirmed
    draft_forwards: int = 0  # one-row forwards the drafter ran (its first N layers)

    @property
    def acceptance(self) -> float:
        """Confirmed drafts over drafts verified (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0


class StreamDrafter(Protocol):
    """Guesses a lone stream's next tokens from its decoded context and its integer sequence."""

    @property
    def name(self) -> str: ...

    def guess(self, context: Sequence[int], sequence: IntSequence, limit: int,
              counts: DraftCounts) -> list[int]: ...


@dataclass(frozen=True)
class LookupDrafter:
    """A context-only draft policy (prompt lookup): the sequence is not touched."""

    policy: DraftPolicy

    @property
    def name(self) -> str:
        return self.policy.name

    def guess(self, context: Sequence[int], sequence: IntSequence, limit: int,
              counts: DraftCounts) -> list[int]:
        return self.policy.draft(context, [], limit)


@dataclass(frozen=True, eq=False)
class LayerDrafter:
    """Greedy tokens of the first ``engine.num_layers`` layers (``engine``: an
    ``IntegerForward`` over the stream predictor's weights with fewer layers), tried after
    ``first`` (e.g. prompt lookup) where that drafts nothing."""

    engine: IntegerForward
    max_draft: int = 3
    first: StreamDrafter | None = None

    def __post_init__(self) -> None:
        if self.max_draft < 1:
            raise InvalidLevelError(f"a layer drafter drafts 1 or more tokens, not "
                                    f"{self.max_draft}")

    @property
    def name(self) -> str:
        own = f"layers{self.engine.num_layers}x{self.max_draft}"
        return own if self.first is None else f"{self.first.name}+{own}"

    def guess(self, context: Sequence[int], sequence: IntSequence, limit: int,
              counts: DraftCounts) -> list[int]:
        if self.first is not None:
            guesses = self.first.guess(context, sequence, limit, counts)
            if guesses:
                return guesses
        if not context:
            return []
        length = sequence.length
        token = context[-1]
        guesses = []
        try:
            for _ in range(min(limit, self.max_draft)):
                row = self.engine.forward([(sequence, [token])])[0][0]  # [V]
                counts.draft_forwards += 1
                token = int(np.argmax(row))
                guesses.append(token)
        finally:
            sequence.crop(length)
        return guesses

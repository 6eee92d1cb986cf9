"""Draft policies: deterministic guesses of the next tokens, made from what is already decoded.

Speculative decoding forwards a chunk of guessed tokens and keeps the guesses the decoded tokens
confirm. For exact decoding of an arithmetic-coded stream the guesses must be something the
encoder can reproduce: a policy sees only the decoded tokens and the greedy predictions ("hints")
the last forward left at unverified positions, never the coded bits.

Invariants:
1. ``draft`` is a pure function of ``(context, hints, limit)``: no state, no randomness, no clock
   (enforced: the policies are frozen dataclasses; assumed of third-party policies, and then
   caught by the decoder's checksum).
2. ``draft`` returns at most ``limit`` token ids, each one taken from ``context`` or ``hints``,
   so every guess is a valid id for the model (enforced by construction for the policies here).
3. ``hints[j]`` is the guess for position ``len(context) + j``: the argmax of the row the last
   forward computed for that position on a guessed prefix (Jacobi iteration). It is empty after a
   forward whose guesses were all accepted.

Prompt lookup follows "Prompt Lookup Decoding" (Saxena, 2023) and the n-gram drafts of
lookahead decoding; the Jacobi guesses follow Santilli et al., "Accelerating Transformer
Inference for Translation via Parallel Decoding" (ACL 2023).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from seqkv.errors import InvalidLevelError


class DraftPolicy(Protocol):
    """Guesses the tokens after ``context``; see the module invariants."""

    @property
    def name(self) -> str: ...

    def draft(self, context: Sequence[int], hints: Sequence[int], limit: int) -> list[int]: ...


def _check_max_draft(max_draft: int) -> None:
    if max_draft < 0:
        raise InvalidLevelError(f"max_draft must be >= 0 (0 drafts nothing), got {max_draft}")


@dataclass(frozen=True)
class NoDraft:
    """Guesses nothing: the token-by-token schedule of ``seqkv.codec``."""

    @property
    def name(self) -> str:
        return "none"

    def draft(self, context: Sequence[int], hints: Sequence[int], limit: int) -> list[int]:
        return []


@dataclass(frozen=True)
class PromptLookup:
    """Copies what followed the most recent earlier occurrence of the context's last n-gram.

    The longest n-gram, from ``max_ngram`` down to ``min_ngram`` tokens, wins.

    >>> PromptLookup(max_ngram=2, max_draft=3).draft([5, 6, 7, 8, 9, 5, 6], [], limit=8)
    [7, 8, 9]
    >>> PromptLookup().draft([1, 2, 3], [], limit=8)
    []
    >>> PromptLookup(max_draft=5).draft([4, 1, 2, 1, 2], [], limit=8)
    [1, 2, 1, 2, 1]
    """

    max_ngram: int = 3
    min_ngram: int = 1
    max_draft: int = 8  # NOTE: past ~8 the chunk's cost grows faster than its expected yield

    def __post_init__(self) -> None:
        _check_max_draft(self.max_draft)
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise InvalidLevelError(
                f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram} and {self.max_ngram}"
            )

    @property
    def name(self) -> str:
        ngrams = "" if (self.min_ngram, self.max_ngram) == (1, 3) else (
            f"[{self.min_ngram}-{self.max_ngram}]")
        return f"lookup{self.max_draft}{ngrams}"

    def draft(self, context: Sequence[int], hints: Sequence[int], limit: int) -> list[int]:
        length = min(limit, self.max_draft)
        if length <= 0:
            return []
        tokens = list(context)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            suffix = tokens[-n:]
            # The most recent occurrence that ends before the suffix itself starts.
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    # A match that runs into the end continues into the draft itself, so a
                    # period shorter than the draft repeats: [1, 2, 1, 2] drafts 1, 2, 1, 2, ...
                    extended = tokens[start + n : start + n + length]
                    while len(extended) < length:
                        extended.append(extended[len(extended) - (len(tokens) - start - n)])
                    return extended
        return []


@dataclass(frozen=True)
class JacobiDraft:
    """The model's own greedy guesses from the last forward's unverified rows (Jacobi iteration).

    Where there are fewer hints than ``max_draft``, the last token fills the draft: like the
    arbitrary starting point of a Jacobi iteration, those guesses rarely hold, but their rows
    give the next forward its hints.

    >>> JacobiDraft(max_draft=2).draft([1, 2], [7, 8, 9], limit=8)
    [7, 8]
    >>> JacobiDraft(max_draft=3).draft([1, 2], [7], limit=8)
    [7, 2, 2]
    """

    max_draft: int = 8

    def __post_init__(self) -> None:
        _check_max_draft(self.max_draft)

    @property
    def name(self) -> str:
        return f"jacobi{self.max_draft}"

    def draft(self, context: Sequence[int], hints: Sequence[int], limit: int) -> list[int]:
        length = max(0, min(limit, self.max_draft))
        guesses = list(hints[:length])
        return guesses + [context[-1]] * (length - len(guesses)) if context else guesses


@dataclass(frozen=True)
class Fallback:
    """The first policy's draft, or the second's when the first guesses nothing.

    >>> Fallback(PromptLookup(), JacobiDraft(max_draft=3)).draft([1, 2, 3], [4, 5], limit=8)
    [4, 5, 3]
    """

    first: DraftPolicy
    second: DraftPolicy

    @property
    def name(self) -> str:
        return f"{self.first.name}+{self.second.name}"

    def draft(self, context: Sequence[int], hints: Sequence[int], limit: int) -> list[int]:
        return self.first.draft(context, hints, limit) or self.second.draft(context, hints, limit)

"""Match models: the token that followed the longest earlier occurrence of the current context.

Two sources share one model: the dictionary (content the model never saw in this session) and the
session itself. A source answers "where did these last ``min_length`` tokens occur before?"
through a hash index; the model keeps a pointer into its source while the source goes on
predicting the session's tokens, and while its match is short it looks again for a longer one.
Its confidence is an adaptive probability that the predicted token is right, learned per context
of (match length bucket, misses among the last eight predictions): ``MatchConfidence``.

Invariants:
1. Every decision depends only on the tokens given to ``update`` and on the source's content, in
   integer arithmetic (enforced), so encoder and decoder models evolve identically.
2. A predicted position always holds a token the model has seen (dictionary) or the session
   already coded (session source): ``SessionSource`` indexes a context only after its lookup, so
   a context never matches itself (enforced).
3. ``DictionaryIndex`` is immutable after construction; a ``MatchModel`` and a
   ``SessionSource`` mutate only themselves, in ``update`` / ``append``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from seqkv.mixing.dictionary import Dictionary
from seqkv.mixing.fixedpoint import TOTAL

_HASH_MULTIPLIER = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
# NOTE: a common short context ("of the") occurs thousands of times in a large dictionary;
# checking the 8 most recent occurrences keeps a lookup ~20 us and finds the long matches that
# matter (a quoted passage's context is rare).
CANDIDATES_CHECKED = 8
MAX_MATCH = 1 << 16
# NOTE: relook for a longer match while the current one is shorter than this: a short match that
# happens to continue is often the wrong copy of a phrase that occurs in several documents.
RELOOK_BELOW = 32
LENGTH_BUCKETS = 16
MISS_BUCKETS = 4


def context_hash(tokens: Sequence[int]) -> int:
    """The 64-bit polynomial hash of a token window, as ``DictionaryIndex`` computes it."""
    value = 0
    for token in tokens:
        value = (value * _HASH_MULTIPLIER + token) & _MASK64
    return value


class MatchSource(Protocol):
    """Token content a match model can point into."""

    def token(self, position: int) -> int: ...

    def size(self) -> int: ...

    def following(self, context: Sequence[int]) -> list[int]:
        """Positions right after recent occurrences of ``context[-min_length:]``, newest last."""
        ...


class DictionaryIndex:
    """A dictionary's content with a hash index of every ``min_length``-token window.

    Built once per dictionary (a hash per position, one stable sort: ~0.1 s per million tokens)
    and shared by every session's predictor.
    """

    def __init__(self, dictionary: Dictionary, min_length: int = 4) -> None:
        if min_length < 1:
            raise ValueError(f"min_length must be at least 1, not {min_length}")
        self.dictionary = dictionary
        self.min_length = min_length
        tokens = dictionary.tokens.astype(np.uint64)
        self._content: list[int] = dictionary.tokens.tolist()
        windows = max(0, tokens.shape[0] - min_length)  # windows that have a following token
        hashes = np.zeros(windows, dtype=np.uint64)
        multiplier = np.uint64(_HASH_MULTIPLIER)
        for offset in range(min_length):
            hashes = hashes * multiplier + tokens[offset : offset + windows]  # wraps mod 2**64
        order = np.argsort(hashes, kind="stable")
        self._hashes: npt.NDArray[np.uint64] = hashes[order]
        self._following: npt.NDArray[np.int64] = order.astype(np.int64) + min_length

    def token(self, position: int) -> int:
        return self._content[position]

    def size(self) -> int:
        return len(self._content)

    def following(self, context: Sequence[int]) -> list[int]:
        if len(context) < self.min_length or not self._hashes.shape[0]:
            return []
        key = np.uint64(context_hash(context[-self.min_length :]))
        end = int(np.searchsorted(self._hashes, key, side="right"))
        start = max(int(np.searchsorted(self._hashes, key, side="left")),
                    end - CANDIDATES_CHECKED)
        return self._following[start:end].tolist()


class SessionSource:
    """The session's own tokens so far, indexed by ``min_length``-token windows as they arrive."""

    def __init__(self, min_length: int = 4) -> None:
        self.min_length = min_length
        self.tokens: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}

    def token(self, position: int) -> int:
        return self.tokens[position]

    def size(self) -> int:
        return len(self.tokens)

    def following(self, context: Sequence[int]) -> list[int]:
        if len(context) < self.min_length:
            return []
        found = self._index.get(tuple(context[-self.min_length :]))
        return found[-CANDIDATES_CHECKED:] if found else []

    def append(self, token: int) -> None:
        """Add ``token``; index the window that ended just before it (it now has a follower)."""
        tokens = self.tokens
        tokens.append(token)
        if len(tokens) > self.min_length:
            key = tuple(tokens[-1 - self.min_length : -1])
            self._index.setdefault(key, []).append(len(tokens) - 1)


def length_bucket(length: int) -> int:
    """0 for no match, then 1..15 growing roughly logarithmically with the match length."""
    if length < 8:
        return length
    if length < 16:
        return 8 + (length - 8) // 4  # 8, 9
    if length < 32:
        return 10 + (length - 16) // 8  # 10, 11
    if length < 64:
        return 12
    if length < 128:
        return 13
    return 14 if length < 512 else 15


@dataclass(frozen=True)
class MatchPrediction:
    """What a match model predicts for the next token, and the context of its confidence."""

    token: int
    length: int
    context: int  # index into MatchConfidence: length bucket * MISS_BUCKETS + recent misses


class MatchModel:
    """A pointer into a source that follows the session while the source keeps predicting it."""

    def __init__(self, source: MatchSource, min_length: int) -> None:
        self.source = source
        self.min_length = min_length
        self._pointer = -1
        self._length = 0
        self._recent = 0  # one bit per recent prediction: 1 = missed

    def prediction(self) -> MatchPrediction | None:
        if self._pointer < 0:
            return None
        misses = min(MISS_BUCKETS - 1, (self._recent & 0xFF).bit_count())
        context = length_bucket(self._length) * MISS_BUCKETS + misses
        return MatchPrediction(self.source.token(self._pointer), self._length, context)

    def update(self, history: Sequence[int], token: int) -> None:
        """Follow ``token`` (``history`` already ends with it)."""
        if self._pointer >= 0:
            hit = self.source.token(self._pointer) == token
            self._recent = (self._recent << 1 | (not hit)) & 0xFFFF
            if hit and self._pointer + 1 < self.source.size():
                self._pointer += 1
                self._length = min(self._length + 1, MAX_MATCH)
            else:
                self._pointer, self._length = -1, 0
        if self._length < RELOOK_BELOW:
            self._relook(history)

    def _relook(self, history: Sequence[int]) -> None:
        source = self.source
        best_pointer, best_length = self._pointer, self._length
        depth = len(history)
        for following in reversed(source.following(history)):
            if following >= source.size() or following == self._pointer:
                continue
            length = 0
            limit = min(following, depth, RELOOK_BELOW)
            while length < limit and source.token(following - 1 - length) == history[-1 - length]:
                length += 1
            if length >= self.min_length and length > best_length:
                best_pointer, best_length = following, length
        self._pointer, self._length = best_pointer, best_length


class MatchConfidence:
    """Adaptive probabilities (counts out of 2**32) that a match model's prediction is right.

    One probability per context; each moves toward the outcome by 1/(n + 1.5) of the gap after
    its n-th observation, n capped at ``limit`` (so it keeps adapting).
    """

    def __init__(self, initial: Sequence[int] | None = None, limit: int = 255) -> None:
        size = LENGTH_BUCKETS * MISS_BUCKETS
        self.probability = list(initial) if initial is not None else [
            _initial_confidence(context // MISS_BUCKETS, context % MISS_BUCKETS)
            for context in range(size)]
        if len(self.probability) != size:
            raise ValueError(f"expected {size} initial probabilities, got {len(initial or [])}")
        self.count = [0] * size
        self.limit = limit

    def update(self, context: int, hit: bool) -> None:
        target = TOTAL - 1 if hit else 1
        count = self.count[context]
        self.probability[context] += (target - self.probability[context]) * 2 // (2 * count + 3)
        self.count[context] = min(count + 1, self.limit)


def _initial_confidence(bucket: int, misses: int) -> int:
    """A prior before any outcome: longer, cleaner matches are right more often."""
    hit_odds = (bucket + 1) >> misses
    return TOTAL * (hit_odds + 1) // (hit_odds + 2)

"""The mixer's predictors: each names at most one candidate for the next token, with a context.

- ``MatchModel``: the token that followed the longest earlier occurrence of the current context,
  in the dictionary (content the model never saw in this session) or in the session itself. A
  source answers "where did these last ``min_length`` tokens occur before?" through a hash index;
  the model keeps a pointer into its source while the source goes on predicting the session's
  tokens, and while its match is short it looks again for a longer one. Its confidence context
  is (match length bucket, misses among its last eight predictions).
- ``DictionaryNgram``: the dictionary's most frequent follower of the last two tokens; its
  confidence context is (follower count bucket, the follower's share of the context's counts).

``Confidence`` turns a context into an adaptive probability that the named token is right.

Invariants:
1. Every decision depends only on the tokens given to ``update`` and on the dictionary's content,
   in integer arithmetic (enforced), so encoder and decoder predictors evolve identically.
2. A predicted position always holds a token of the dictionary or one the session already coded:
   ``SessionSource`` indexes a window only after the token that follows it arrives, so the current
   context never matches itself (enforced).
3. ``DictionaryIndex`` is immutable after construction and shared by sessions; a predictor, a
   ``SessionSource`` and a ``Confidence`` mutate only themselves, in ``update`` / ``append``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from seqkv.mixing.dictionary import Dictionary
from seqkv.mixing.errors import MixerConfigError
from seqkv.mixing.fixedpoint import TOTAL

_HASH_MULTIPLIER = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
# NOTE: a common short context ("of the") occurs thousands of times in a large dictionary;
# checking the 8 most recent occurrences keeps a lookup at a few tens of microseconds and still
# finds the long matches that matter (a quoted passage's context is rare).
CANDIDATES_CHECKED = 8
MAX_MATCH = 1 << 16
# NOTE: relook for a longer match while the current one is shorter than this: a short match that
# happens to continue is often the wrong copy of a phrase that occurs in several documents.
RELOOK_BELOW = 32
CONTEXTS = 64  # confidence contexts per predictor
MISS_BUCKETS = 4


def context_hash(tokens: Sequence[int]) -> int:
    """The 64-bit polynomial hash of a token window, as ``DictionaryIndex`` computes it."""
    value = 0
    for token in tokens:
        value = (value * _HASH_MULTIPLIER + token) & _MASK64
    return value


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predictor's candidate for the next token and the context of its confidence."""

    token: int
    context: int  # 0 <= context < CONTEXTS


class Predictor(Protocol):
    """What the mixer asks of a predictor."""

    def prediction(self) -> Prediction | None:
        """The candidate for the next token, or None."""
        ...

    def update(self, history: Sequence[int], token: int) -> None:
        """Follow ``token``; ``history`` already ends with it."""
        ...


class MatchSource(Protocol):
    """Token content a match model can point into."""

    def token(self, position: int) -> int: ...

    def size(self) -> int: ...

    def following(self, context: Sequence[int]) -> list[int]:
        """Positions right after recent occurrences of the context's last window, newest last."""
        ...


class DictionaryIndex:
    """A dictionary's content with a hash index of its windows and its two-token follower counts.

    Built once per dictionary (a hash per position, sorts: well under a second per million tokens)
    and shared by every session's predictor. Nothing here is stored in the dictionary file.
    """

    def __init__(self, dictionary: Dictionary, min_length: int = 3) -> None:
        if min_length < 1:
            raise MixerConfigError(f"min_length must be at least 1, not {min_length}")
        self.dictionary = dictionary
        self.min_length = min_length
        self._content: list[int] = dictionary.tokens.tolist()
        tokens = dictionary.tokens.astype(np.int64)
        windows = max(0, tokens.shape[0] - min_length)  # windows that have a following token
        hashes = np.zeros(windows, dtype=np.uint64)
        multiplier = np.uint64(_HASH_MULTIPLIER)
        wide = tokens.astype(np.uint64)
        for offset in range(min_length):
            hashes = hashes * multiplier + wide[offset : offset + windows]  # wraps mod 2**64
        order = np.argsort(hashes, kind="stable")
        self._hashes: npt.NDArray[np.uint64] = hashes[order]
        self._following: npt.NDArray[np.int64] = order.astype(np.int64) + min_length
        self._build_followers(tokens, dictionary.vocab_size)

    def _build_followers(self, tokens: npt.NDArray[np.int64], vocab: int) -> None:
        contexts = tokens[:-2] * vocab + tokens[1:-1]
        pairs, counts = np.unique(contexts * vocab + tokens[2:], return_counts=True)
        pair_contexts, followers = pairs // vocab, pairs % vocab
        order = np.lexsort((-counts, pair_contexts))  # by context, most frequent follower first
        keys, first = np.unique(pair_contexts[order], return_index=True)
        self._pair_keys: npt.NDArray[np.int64] = keys
        self._top: npt.NDArray[np.int64] = followers[order][first]
        self._top_count: npt.NDArray[np.int64] = counts[order][first]
        self._pair_total: npt.NDArray[np.int64] = (
            np.add.reduceat(counts[order], first) if first.size else first)

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
        found: list[int] = self._following[start:end].tolist()
        return found

    def top_follower(self, first: int, second: int) -> tuple[int, int, int] | None:
        """(token, its count, all counts) of the most frequent follower of two tokens, if any."""
        key = first * self.dictionary.vocab_size + second
        j = int(np.searchsorted(self._pair_keys, key))
        if j >= self._pair_keys.shape[0] or int(self._pair_keys[j]) != key:
            return None
        return int(self._top[j]), int(self._top_count[j]), int(self._pair_total[j])


class SessionSource:
    """The session's own tokens so far, indexed by ``min_length``-token windows as they arrive."""

    def __init__(self, min_length: int = 3) -> None:
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
    """0..15, growing roughly logarithmically with the match length."""
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


class MatchModel:
    """A pointer into a source that follows the session while the source keeps predicting it."""

    def __init__(self, source: MatchSource, min_length: int) -> None:
        self.source = source
        self.min_length = min_length
        self._pointer = -1
        self._length = 0
        self._recent = 0  # one bit per recent prediction: 1 = missed

    @property
    def length(self) -> int:
        """The current match's length in tokens (0: no match)."""
        return self._length

    @property
    def pointer(self) -> int:
        """The source position of the predicted token (-1: no match)."""
        return self._pointer

    def prediction(self) -> Prediction | None:
        if self._pointer < 0:
            return None
        misses = min(MISS_BUCKETS - 1, (self._recent & 0xFF).bit_count())
        context = length_bucket(self._length) * MISS_BUCKETS + misses
        return Prediction(self.source.token(self._pointer), context)

    def update(self, history: Sequence[int], token: int) -> None:
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


class DictionaryNgram:
    """The dictionary's most frequent follower of the session's last two tokens."""

    def __init__(self, index: DictionaryIndex) -> None:
        self.index = index
        self._found: tuple[int, int, int] | None = None

    def prediction(self) -> Prediction | None:
        if self._found is None:
            return None
        token, count, total = self._found
        share = min(MISS_BUCKETS - 1, MISS_BUCKETS * count // (total + 1))
        return Prediction(token, min(15, count.bit_length()) * MISS_BUCKETS + share)

    def update(self, history: Sequence[int], token: int) -> None:
        self._found = (self.index.top_follower(history[-2], history[-1])
                       if len(history) >= 2 else None)


class Confidence:
    """Adaptive probabilities (counts out of 2**32) that a predictor's candidate is right.

    One probability per context; each moves toward the outcome by 1/(n + 1.5) of the gap after
    its n-th observation, n capped at ``limit`` (so it keeps adapting). The prior of context
    ``bucket * 4 + misses`` is (b + 1) / (b + 2) with b = (bucket + 1) >> misses: longer, cleaner
    matches and more frequent followers are right more often.
    """

    def __init__(self, limit: int = 255) -> None:
        self.probability = [_prior(context // MISS_BUCKETS, context % MISS_BUCKETS)
                            for context in range(CONTEXTS)]
        self.count = [0] * CONTEXTS
        self.limit = limit

    def update(self, context: int, hit: bool) -> None:
        target = TOTAL - 1 if hit else 1
        count = self.count[context]
        self.probability[context] += (target - self.probability[context]) * 2 // (2 * count + 3)
        self.count[context] = min(count + 1, self.limit)


def _prior(bucket: int, misses: int) -> int:
    odds = (bucket + 1) >> misses
    return TOTAL * (odds + 1) // (odds + 2)

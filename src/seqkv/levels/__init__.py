"""The rate-compute dial: how a session's tokens are coded, from fewest bits to fastest decoding.

Every level is exact: the decoder returns the encoder's tokens and KV bit for bit, or raises.

=============  ==============================================  ====================================
level          tokens coded under                              decoding
=============  ==============================================  ====================================
``tokens``     the model, transformers' forward, token by      one forward per token, 1 thread
               token (``levels/tokens.py``)
``rows``       the model, row-invariant forward                one forward per token or fewer: the
               (``levels/rows.py``)                            spare rows of each forward verify
                                                               prompt-lookup guesses; sessions can
                                                               share forwards (``decompress_batch``)
``segments``   the model, in N independent segments, each      the N segments step together, one
               started after the start token (or prefix)       forward per N tokens; more bits
               (``levels/segments.py``)
``ngram``      an adaptive count model, integer arithmetic     no model forward per token; one
               (``levels/ngram.py``)                           float prefill for the KV
``plain``      the uniform distribution (``levels/plain.py``)  as ``ngram``
``portable``   the model evaluated in integer arithmetic:      one integer forward per token or
               the same tables on every machine                fewer (drafts), sessions batched,
               (``levels/portable.py``); ``portable:N`` runs   any machine; one float prefill for
               the first N layers only                         the KV (exact on the same profile)
``portable``   ``portable`` mixed, exactly, with a mixing      as ``portable``, plus the mixer's
``+mix``       dictionary's predictors (``seqkv.mixing``)      work (small beside a forward)
``portable4``  ``portable`` on the model's Q4_1 weight         as ``portable``, a step reading
               blocks (``models/integer/blocks.py``);          fewer weight bytes
               ``portable4:N`` the first N layers
=============  ==============================================  ====================================

A level implements ``CodingLevel`` (``levels/base.py``): ``spec`` (name, whether decoding needs
the model, the schedule its probabilities depend on, what decoding costs, its batch group),
``encode`` and ``decode``. Adding a level is one file beside these and one entry in ``LEVELS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from seqkv.errors import InvalidLevelError
from seqkv.levels.base import (
    CodingLevel,
    DecodeOutput,
    DecodeRequest,
    EncodeOutput,
    EncodeRequest,
    KVClasses,
    LevelSpec,
    TraceColumns,
    segment_order,
)
from seqkv.levels.ngram import NgramLevel
from seqkv.levels.plain import PlainLevel
from seqkv.levels.portable import PortableLevel
from seqkv.levels.rows import RowsLevel
from seqkv.levels.segments import SegmentsLevel
from seqkv.levels.tokens import TokensLevel
from seqkv.session import split_lengths

LevelFactory = Callable[[int | None], CodingLevel]


def _no_count(make: Callable[[], CodingLevel], name: str) -> LevelFactory:
    def factory(count: int | None) -> CodingLevel:
        if count is not None:
            raise InvalidLevelError(f"level {name!r} takes no count")
        return make()
    return factory


def _portable(count: int | None) -> CodingLevel:
    return PortableLevel(count)


def _portable_mix(count: int | None) -> CodingLevel:
    return PortableLevel(count, mix=True)


def _portable4(count: int | None) -> CodingLevel:
    return PortableLevel(count, bits=4)


def _segments(count: int | None) -> CodingLevel:
    if count is None:
        raise InvalidLevelError("write the segments level as segments:N with N >= 2")
    return SegmentsLevel(count)


# The registry: a level's name (before any ":N") to its constructor.
LEVELS: Mapping[str, LevelFactory] = MappingProxyType({
    "tokens": _no_count(TokensLevel, "tokens"),
    "rows": _no_count(RowsLevel, "rows"),
    "segments": _segments,
    "ngram": _no_count(NgramLevel, "ngram"),
    "plain": _no_count(PlainLevel, "plain"),
    "portable": _portable,
    "portable+mix": _portable_mix,
    "portable4": _portable4,
})
DEFAULT_LEVEL = "portable"


def parse_level(text: str) -> CodingLevel:
    """``tokens``, ``rows``, ``segments:N``, ``ngram``, ``plain``, ``portable``,
    ``portable:N``, ``portable+mix``, ``portable4`` or ``portable4:N`` (see ``LEVELS``)."""
    name, colon, count = text.partition(":")
    factory = LEVELS.get(name)
    if factory is None:
        raise InvalidLevelError(
            f"unknown level {text!r}: choose one of {', '.join(LEVELS)} (segments:N)")
    # NOTE: ASCII digits only: str.isdigit accepts "²", which int() refuses.
    if colon and not (count.isascii() and count.isdigit()):
        raise InvalidLevelError(f"the count in level {text!r} must be a positive integer")
    try:
        return factory(int(count) if colon else None)
    except InvalidLevelError:
        raise
    except ValueError as error:
        raise InvalidLevelError(f"level {text!r}: {error}") from None


def family(level: CodingLevel) -> str:
    """The level's name without its count: what a version-2 file header records."""
    return level.spec.name.partition(":")[0]


__all__ = [
    "DEFAULT_LEVEL",
    "LEVELS",
    "CodingLevel",
    "DecodeOutput",
    "DecodeRequest",
    "EncodeOutput",
    "EncodeRequest",
    "KVClasses",
    "LevelSpec",
    "NgramLevel",
    "PlainLevel",
    "PortableLevel",
    "RowsLevel",
    "SegmentsLevel",
    "TokensLevel",
    "TraceColumns",
    "family",
    "parse_level",
    "segment_order",
    "split_lengths",
]

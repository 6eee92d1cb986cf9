"""Which codec codes a level, and which decodes a stored span: the store's codec registry.

A store keeps each codec's identity once, under an index its span records name. A worker makes
one codec per level (``CodecFactory``) and registers its identity before it codes; to decode a
span it asks the level's codec for a ``reader`` of the identity the span's index names (its own,
an earlier release's whose records it still reads, or at a portable level another machine's).

Invariants:
1. A span is decoded only by the reader its stored identity gets; no reader raises
   ``CodecMismatchError`` naming both identities (enforced). New spans are coded only by
   ``for_level``'s codecs, this worker's own.
2. ``for_index`` caches per index; ``for_level`` per level (both immutable once made).
"""

from __future__ import annotations

from collections.abc import Callable

from seqkv.codec import DEFAULT_TOLERANCE
from seqkv.models.adapter import CausalLM
from seqkv.store.backends.base import StoreBackend
from seqkv.store.codec import SpanCodec, StoredReader
from seqkv.store.codecs import ModelCodec
from seqkv.store.errors import CodecMismatchError

CodecFactory = Callable[[str], SpanCodec]
"""Gives the codec for a level name (``"portable"``, ``"ngram"``, ...)."""


def model_codecs(model: CausalLM, tolerance: float = DEFAULT_TOLERANCE) -> CodecFactory:
    """A factory of ``ModelCodec``s over ``model``, one per level, made on first use."""
    made: dict[str, SpanCodec] = {}

    def factory(level: str) -> SpanCodec:
        if level not in made:
            made[level] = ModelCodec(model, level, tolerance)
        return made[level]

    return factory


class CodecRegistry:
    """The codecs of one store on this worker, by level and by stored index."""

    def __init__(self, backend: StoreBackend, factory: CodecFactory) -> None:
        self._backend = backend
        self._factory = factory
        self._by_level: dict[str, tuple[SpanCodec, int]] = {}
        self._by_index: dict[int, StoredReader] = {}

    def for_level(self, level: str) -> tuple[SpanCodec, int]:
        """The codec that codes ``level`` here, and its index in the store."""
        if level not in self._by_level:
            codec = self._factory(level)
            index = self._backend.register_codec(codec.identity())
            self._by_level[level] = (codec, index)
            self._by_index[index] = (codec, None)
        return self._by_level[level]

    def for_index(self, index: int) -> StoredReader:
        """The codec that decodes spans of the stored codec ``index``, and the version-1
        record layout of those spans (None: they are the codec's current records)."""
        if index not in self._by_index:
            identity = self._backend.codec(index)
            codec = self._factory(identity.level)
            found = codec.reader(identity)
            if found is None:
                raise CodecMismatchError(
                    f"a stored span was coded by {identity.description}; this worker's codec "
                    f"for level {identity.level!r} is {codec.identity().description}: decode on "
                    "a worker with the same model and tolerance (and, at a level that is not "
                    "portable, the same execution profile)")
            self._by_index[index] = found
        return self._by_index[index]

"""A warm entry's header with the config its codec runs with: ``seqkv.formats.warm_entry``'s
stored fields, mapped to and from ``seqkv.warm.config``'s configs.

The layout, its version and its envelope are ``seqkv.formats.warm_entry``'s; this module adds
what a format module cannot know: the ids' meaning (predictor, quantizer, dtype).

Invariants:
1. ``read_entry`` checks, in order: the envelope and every field's range
   (``seqkv.formats.warm_entry`` invariant 1), the ids against this seqkv's tables
   (``CorruptFileError``: ``seqkv.warm.config.config_of``), the model digest and geometry
   (``ModelMismatchError``), the tag when the caller names one (``WarmTagMismatchError``)
   (enforced; a test each). The codec then checks the payload.
2. ``header_bytes`` and ``write_entry`` write exactly what the format module writes for the
   config's ``coding()`` (enforced by construction: they call it).
"""

from __future__ import annotations

from dataclasses import dataclass

from seqkv.digests import Digest
from seqkv.formats import warm_entry as layout
from seqkv.types import KVGeometry
from seqkv.warm.config import EntryConfig, WarmModel, config_of


@dataclass(frozen=True)
class EntryHeader:
    model: Digest
    tag: Digest | None
    config: EntryConfig
    geometry: KVGeometry
    num_tokens: int

    def stored(self) -> layout.EntryHeader:
        """The header's stored fields."""
        return layout.EntryHeader(self.model, self.tag, self.config.coding(), self.geometry,
                                  self.num_tokens)


def header_bytes(header: EntryHeader) -> bytes:
    return layout.header_bytes(header.stored())


def write_entry(header: EntryHeader, payload: bytes) -> bytes:
    """The framed entry (every byte a store keeps)."""
    return layout.write_entry(header.stored(), payload)


def read_entry(data: bytes, model: WarmModel, tag: Digest | None = None
               ) -> tuple[EntryHeader, bytes]:
    """The header and payload of an entry for ``model`` (and ``tag``, when given), checked."""
    stored, payload = layout.read_entry(data)
    config = config_of(stored.coding)
    layout.check_entry(stored, model.digest, model.geometry, tag)
    return EntryHeader(stored.model, stored.tag, config, stored.geometry,
                       stored.num_tokens), payload

"""The codec seam: what the store needs from a session codec, and nothing more.

Motivation: the store must outlive the codec's current container. It keeps a codec's identity
(model, execution profile, level) once per store and, per span, only the bytes the codec returns
for the tokens after a prefix. Any codec that implements ``SessionCodec`` plugs in: the adapter
over today's ``seqkv.compress`` (``seqkv.store.skv_adapter.SkvCodec``) and a model-free
tokens-only codec (``seqkv.store.skv_adapter.PortableTokenCodec``) do.

Invariants (the ``SessionCodec`` contract):
1. ``decode_many([(encode(tokens, kv, prefix).payload, prefix)])`` returns the tokens after the
   prefix, and the KV the encoder reported in ``EncodedSpan.kv`` when it reported one, bit for
   bit, or raises (assumed of every codec; tested for both shipped ones).
2. A payload decodes only against the exact ``PrefixState`` it was coded against: its tokens and
   its KV bits (assumed; the store always passes the state it decoded from the parent span).
3. ``identity().digest`` changes whenever anything that decoding depends on changes (assumed).
4. A ``DictionaryCodec`` whose ``uses_dictionary`` is True codes with the dictionary the store
   hands it and names it by digest inside the payload (``payload_dictionary``); it decodes only
   with that dictionary, found through the ``DictionarySource`` the store hands it, which looks
   in the span's own namespace alone (assumed of every such codec; tested for ``SkvCodec``).

Nothing here mutates anything: the types are frozen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from seqkv.codec import DictionarySource
from seqkv.mixing.dictionary import Dictionary, DictionaryDigest
from seqkv.store.ids import CodecDigest


@dataclass(frozen=True, slots=True)
class CodecIdentity:
    """What a store records once per codec: a digest and the JSON description it digests."""

    digest: CodecDigest
    description: str  # canonical JSON (sorted keys); holds at least "codec" and "level"
    level: str

    @classmethod
    def of(cls, description: Mapping[str, object]) -> CodecIdentity:
        """The identity of ``description`` (canonical JSON, SHA-256).

        >>> CodecIdentity.of({"codec": "x", "level": "plain"}).digest[:12]
        'dc9a8b75c541'
        """
        text = json.dumps(description, sort_keys=True, separators=(",", ":"), default=str)
        level = str(description.get("level", ""))
        return cls(CodecDigest(hashlib.sha256(text.encode()).hexdigest()), text, level)


@dataclass(frozen=True)
class PrefixState:
    """A decoded prefix a span continues: its tokens and the KV a decoder rebuilt for them."""

    tokens: tuple[int, ...]
    kv: torch.Tensor | None  # [layers, 2, kv_heads, len(tokens), head_dim] float32; None: no KV


@dataclass(frozen=True)
class EncodedSpan:
    """A coded span: the payload the store keeps, and figures about it."""

    payload: bytes
    tokens: int  # coded tokens (after the prefix)
    coded_bytes: int  # of the payload, the coded tokens and residual (the rest is framing)
    container_bytes: int  # what the same span costs as a standalone file (0: no such file)
    kv: torch.Tensor | None  # the whole KV a decoder will rebuild, when known without decoding
    kv_exact: bool  # the rebuilt KV equals the caller's bit for bit (True when none was given)


@dataclass(frozen=True)
class DecodedSpan:
    """A decoded span: its tokens (after the prefix) and the whole KV, prefix included."""

    tokens: list[int]
    kv: torch.Tensor | None  # [layers, 2, kv_heads, prefix + tokens, head_dim]; None: no KV
    # The KV is the encoder's, verified (False: a portable level decoded under another execution
    # profile; the tokens are verified, the KV is this worker's recomputation).
    kv_exact: bool = True


@runtime_checkable
class SessionCodec(Protocol):
    """Codes the tokens (and KV residual) of a span that continues a prefix."""

    def identity(self) -> CodecIdentity:
        """The codec's identity, stored once per store."""
        ...

    @property
    def uses_kv(self) -> bool:
        """Whether spans carry KV (then a prefix must come with its KV)."""
        ...

    @property
    def max_prefix_error(self) -> float:
        """How far a caller's KV over a stored prefix may be from the stored prefix's KV for a
        session to be coded against that prefix (the residual tolerance)."""
        ...

    def encode(self, tokens: Sequence[int], kv: torch.Tensor | None,
               prefix: PrefixState | None) -> EncodedSpan:
        """Code ``tokens[len(prefix.tokens):]``; ``tokens`` and ``kv`` cover the prefix too."""
        ...

    def decode_many(self, items: Sequence[tuple[bytes, PrefixState | None]]
                    ) -> list[DecodedSpan]:
        """Decode many payloads, sharing model forwards where the level allows."""
        ...


@runtime_checkable
class DictionaryCodec(SessionCodec, Protocol):
    """A ``SessionCodec`` that may code with a mixing dictionary (``seqkv.mixing``).

    The store hands it the namespace's current dictionary to encode, and a source that finds
    dictionaries by digest in the span's namespace to decode. Codecs without this protocol (or
    with ``uses_dictionary`` False) are called through ``SessionCodec`` alone.
    """

    @property
    def uses_dictionary(self) -> bool:
        """Whether spans are coded with a dictionary (the level mixes)."""
        ...

    def payload_dictionary(self, payload: bytes) -> DictionaryDigest | None:
        """The digest of the dictionary a payload was coded with (None: none)."""
        ...

    def encode_with_dictionary(self, tokens: Sequence[int], kv: torch.Tensor | None,
                               prefix: PrefixState | None,
                               dictionary: Dictionary | None) -> EncodedSpan:
        """``encode`` with ``dictionary``; the payload names it by digest."""
        ...

    def decode_many_with_dictionaries(self, items: Sequence[tuple[bytes, PrefixState | None]],
                                      dictionaries: DictionarySource) -> list[DecodedSpan]:
        """``decode_many``, finding each payload's dictionary in ``dictionaries``."""
        ...

"""The codec seam: what the store needs from a span codec, in one protocol.

Motivation: the store must outlive any one codec. It keeps a codec's identity (model, execution
profile, level, tolerance) once per store and, per span, only the coded fields of a
``seqkv.session.CodedSession`` in a span record (``seqkv.formats.span``). Any codec that
implements ``SpanCodec`` plugs in: the model's (``seqkv.store.codecs.ModelCodec``, any level)
and a model-free tokens-only one (``seqkv.store.codecs.TokensCodec``) do.

Invariants (the ``SpanCodec`` contract):
1. ``decode_many`` of a record holding ``encode(tokens, kv, prefix, d).session``'s fields,
   with the same prefix and dictionary, returns ``tokens`` (the prefix's included: its decoder
   verifies them all against the record's tokens digest) and the KV the encoder reported in
   ``EncodedSpan.kv``, bit for bit, or raises (assumed of every codec; tested for both shipped
   ones; the length is checked by ``seqkv.store.chains``, invariant 6). Its KV digest covers
   the positions after the prefix only (``kv_scope`` "tail"): the prefix is a parent span the
   store decoded and verified first.
2. ``identity().digest`` changes whenever anything that decoding depends on changes, and
   ``reads`` accepts exactly the identities whose spans the codec decodes: its own, and those of
   earlier releases of it whose records it still reads (assumed).
3. A span coded with a dictionary names it by digest; it decodes only with that dictionary,
   which the store finds in the span's own namespace alone (enforced by the store).
4. ``encode`` evaluates the bounds of ``seqkv.bounds`` on what it coded and raises
   ``BoundViolationError`` when one fails: the store then commits nothing (enforced by both
   codecs; tested).

Nothing here mutates anything: the types are frozen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from seqkv.bounds import Bound
from seqkv.codec import Theorem1
from seqkv.formats.residual import encode_residual_section
from seqkv.formats.span import SpanRecord, Version1Layout
from seqkv.mixing.dictionary import Dictionary
from seqkv.session import CodedSession, Prefix
from seqkv.store.backends.base import CodecIdentity


@dataclass(frozen=True)
class EncodedSpan:
    """A coded span: the session's fields the record keeps, and figures about it."""

    session: CodedSession  # its ``kv_scope`` is "tail"
    bounds: tuple[Bound, ...]  # every one holds (``encode`` raised otherwise)
    theorem1: Theorem1 | None  # exact at every coded position; None: model-free tables
    kv: torch.Tensor | None  # the whole KV a decoder rebuilds (prefix included); None: none
    kv_exact: bool  # the rebuilt KV equals the caller's bit for bit (True when none was given)

    @property
    def coded_bytes(self) -> int:
        """Bytes of coded tokens and residual: what a span holds beyond its frame."""
        residual = self.session.residual
        return len(self.session.token_code.data) + (
            0 if residual is None else len(encode_residual_section(residual)))


@dataclass(frozen=True)
class SpanItem:
    """One stored span to decode: its record, the prefix it continues (the decoded parent
    chain, cut at the record's start) and the dictionary it names."""

    record: SpanRecord
    prefix: Prefix | None
    dictionary: Dictionary | None = None


@dataclass(frozen=True)
class DecodedSpan:
    """A decoded span: its chain's tokens and KV, the prefix's included."""

    tokens: list[int]  # prefix + the span's own
    kv: torch.Tensor | None  # [layers, 2, kv_heads, prefix + tokens, head_dim]; None: no KV
    # The KV is the encoder's, verified (False: a portable level decoded under another execution
    # profile; the tokens are verified, the KV is this worker's recomputation).
    kv_exact: bool = True


StoredReader = tuple["SpanCodec", Version1Layout | None]
"""A stored codec's reader here: the codec that decodes its spans, and their record layout."""


class SpanCodec(Protocol):
    """Codes the tokens (and KV residual) of a span that continues a prefix."""

    def identity(self) -> CodecIdentity:
        """The codec's identity, stored once per store."""
        ...

    def reader(self, identity: CodecIdentity) -> StoredReader | None:
        """The codec that decodes spans stored under ``identity`` and the layout of their
        records (None: the current records; else the version-1 layout an earlier release
        wrote), or None when no codec of this worker reads them. The reader is this codec for
        its own identity; at a portable level, spans another machine coded get a reader bound
        to that machine's execution profile (its tokens verify here, its KV is recomputed)."""
        ...

    @property
    def uses_kv(self) -> bool:
        """Whether spans carry KV (then a prefix must come with its KV)."""
        ...

    @property
    def mixes(self) -> bool:
        """Whether spans are coded with the namespace's mixing dictionary."""
        ...

    @property
    def max_prefix_error(self) -> float:
        """How far a caller's KV over a stored prefix may be from the stored prefix's KV for a
        session to be coded against that prefix (the residual tolerance)."""
        ...

    @property
    def max_tokens(self) -> int | None:
        """The most tokens a chain this codec decodes may hold (the model's context); None: no
        limit of its own. The store refuses a longer session before any forward."""
        ...

    def encode(self, tokens: Sequence[int], kv: torch.Tensor | None, prefix: Prefix | None,
               dictionary: Dictionary | None) -> EncodedSpan:
        """Code ``tokens[len(prefix.tokens):]``; ``tokens`` and ``kv`` cover the prefix too."""
        ...

    def decode_many(self, items: Sequence[SpanItem]) -> list[DecodedSpan]:
        """Decode many spans, sharing model forwards where the level allows."""
        ...

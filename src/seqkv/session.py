"""The one value between the codec and every byte layout: a coded session, and the prefix it
continues.

A session's tokens become a ``CodedSession``: the level that coded them, the token code, the KV
residual (if any) and the digests that let a decoder verify what it rebuilt. The codec
(``seqkv.codec``) produces and consumes this value and nothing else; every byte layout is a
sibling format of it in ``seqkv.formats``: the ``.skv`` file (current format), older ``.skv``
formats (read into the same value) and the store's span record. Nobody goes through another
format's bytes to reach the value.

A ``Prefix`` is what a session continues: shared tokens and the KV a decoder rebuilt for them.
Levels, the codec, the trie and the store all speak of it; its KV digest is computed on first
use and kept, so a prefix's KV is hashed at most once however many users ask.

Invariants:
1. Importing this module loads neither torch nor transformers (enforced by
   ``tests/test_layering.py``): the formats read and write ``CodedSession`` without them.
2. ``CodedSession`` holds no description of the model or profile, only their digests (the
   descriptions live once where needed, ``seqkv.descriptions``) (enforced by its fields).
3. ``kv_scope`` says what ``kv_digest`` covers: the whole KV (a ``.skv`` file: its decoder
   needs nothing else to verify it), or only the positions after the prefix (a store span: its
   prefix is a parent span the decoder verified before) (enforced by the codec, both ways).
4. ``code_form`` says what the token code's writer promised (``seqkv.coding.arithmetic``
   invariants 2, 5, 6): ``floored`` (a fresh encode, a ``.skv`` file of format 5: exactly
   ``ArithmeticEncoder.finish``'s bits, so the decoder guards its information and checks the
   bits are canonical), ``trimmed`` (``.skv`` formats 3 and 4: ``finish``'s bits with every
   trailing zero dropped, checked canonical, no guard) or ``bytes`` (whole bytes, padding
   included: a store span record of version 1 or 2, a format-1/2 file; no guard, checked
   canonical at whole bytes, so a byte appended after the code is refused) (enforced by the
   codec). A span record of version 3 keeps its code's bit length: ``floored``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal, NewType

from seqkv.coding.arithmetic import BitStream
from seqkv.coding.residual_code import ResidualCode
from seqkv.digests import Digest

if TYPE_CHECKING:
    import torch

KVScope = Literal["all", "tail"]
CodeForm = Literal["floored", "trimmed", "bytes"]

PrefixHash = NewType("PrefixHash", str)
"""64 lowercase hexadecimal digits: the SHA-256 content hash of a namespace and a prefix's
tokens (``seqkv.trie.keys.prefix_hash``)."""


@dataclass(frozen=True)
class PrefixRef:
    """How a session names the shared prefix it continues: by content hash (a
    ``seqkv.trie.PrefixTrie`` finds it), length and the digest of its KV."""

    prefix_hash: str  # 64 hex digits: the prefix's content hash
    tokens: int
    kv_digest: Digest  # of the prefix's stored KV


@dataclass(frozen=True, eq=False)
class Prefix:
    """A prefix a session continues: its tokens and the KV a decoder rebuilt for them.

    ``prefix_hash`` is the content hash a ``.skv`` file names it by (a trie's prefix), or None
    for a prefix that only a store's chain names. ``kv_digest`` is computed on first use and
    kept (invariant: a prefix's KV is hashed at most once).
    """

    tokens: tuple[int, ...]
    kv: torch.Tensor | None  # [layers, 2, kv_heads, len(tokens), head_dim] float32; None: none
    prefix_hash: PrefixHash | None = None

    @cached_property
    def kv_digest(self) -> Digest:
        """The digest of the prefix's KV (``seqkv.kvcache.kv_digest``), hashed once."""
        if self.kv is None:
            raise ValueError("a prefix without KV has no KV digest")
        from seqkv.kvcache import kv_digest

        return kv_digest(self.kv)

    def ref(self) -> PrefixRef:
        """How a ``.skv`` file names this prefix."""
        if self.prefix_hash is None:
            raise ValueError("a prefix without a content hash cannot be named in a file")
        return PrefixRef(self.prefix_hash, len(self.tokens), self.kv_digest)


@dataclass(frozen=True)
class CodedSession:
    """A session's tokens as coded, with what verifies a decode: the codec's one product."""

    level: str  # the level's name: "portable", "segments:4", ...
    count: int  # tokens coded (after the prefix)
    segments: tuple[int, ...]  # segment lengths, in coding order
    vocab_size: int | None  # recorded by levels that decode without the model
    model_digest: Digest
    profile_digest: Digest
    tokens_digest: Digest  # of every token, the prefix's included
    kv_digest: Digest | None  # None: the encoder computed no KV (a portable level, tokens only)
    prefix: PrefixRef | None  # the prefix a .skv file continues (a store names its parent span)
    dictionary: str | None  # the mixing dictionary's digest (64 hex digits), if one coded it
    token_code: BitStream
    residual: ResidualCode | None
    kv_scope: KVScope = "all"
    code_form: CodeForm = "bytes"  # what the token code's writer promised (invariant 4)


def split_lengths(count: int, segments: int) -> list[int]:
    """``count`` tokens in ``segments`` consecutive parts, the first ones longer by at most 1."""
    segments = max(1, min(segments, count))
    base, extra = divmod(count, segments)
    return [base + (1 if j < extra else 0) for j in range(segments)]

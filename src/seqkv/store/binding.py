"""A session row bound to what it names: the digest that makes a damaged row a refusal.

Motivation: a span's record carries the digests of its chain's tokens and KV, and every decode
verifies them, but the session row that says which span ends a session and how many of its
tokens the session holds was trusted as read. A row whose length was lowered, or that points at
another session's span, or over whose span another span's record was copied, decoded without an
error to tokens of another session. So each row carries a binding: a digest over the
namespace's key, the session id, the length, the span it names, the digest of the session's
tokens and the KV digest its span's record holds, recorded when a put or an append commits the
row and compared on every read, once the chain's spans were decoded and verified against their
own digests (so the KV digest vouches for the KV the read returns).

What it catches: any change of a row's span or length, a row copied to another id or namespace,
a record file replaced by another span's (even one of the same tokens and another KV), metadata
damage of any kind that the decode survives, and a row whose binding was stripped or replaced by
the unbound mark (the mark switches the check off only for a row the upgrade listed, below).
What it does not: a writer with access to the store who recomputes the binding (the digest has
no key: it detects damage and misdirection, it does not authenticate a writer); for the same
reason a writer who edits a row and the legacy list alike, or who removes every trace of the
upgrade from a store that holds nothing else written since (invariant 4), is out of scope.

Invariants:
1. The binding is a pure function of (namespace key, session id, length, span id, tokens digest
   of the session's tokens, the KV digest of the span's record or none); computing it on a read
   costs one SHA-256 over the session's token ids and no pass over its KV (enforced:
   ``session_binding``).
2. A row written before the store's schema version 2 carries the ``UNBOUND`` mark, which the
   upgrade from schema 1 writes on every older row, and it reads (checked by its chain's
   digests, not by a binding) only while it is the row the upgrade listed: the upgrade records
   each row's (span, length) in a legacy list, in the same atomic step that records the schema,
   and a put, an append or a delete that rewrites or removes the row drops it from the list in
   its own atomic step. An unbound row that is not on the list, or whose span or length differ
   from the listed ones, is ``CorruptRecordError`` (enforced by
   ``seqkv.store.backends.base.session_entry``; the list is consulted in the same request that
   reads the row). A row with neither a binding nor the mark is refused, so that a row written
   by hand in the old form does not pass as an old row (enforced, same place). Assumed: no
   process of an earlier seqkv, which keeps no list, writes the store after its upgrade (it
   checks the schema when it opens the store, not at each write).
3. A store of schema 2 (upgraded by a seqkv that kept no list) is upgraded to 3 by listing its
   unbound rows whose span's record is of version ``SCHEMA_1_SPAN_VERSION``, the only version a
   store of schema 1 holds; an unbound row naming a later record cannot predate schema 2 and is
   not listed (so it is refused). What a schema-2 store's rows suffered before this upgrade is
   not provable either way: those rows are trusted as the seqkv that upgraded them trusted them
   (assumed).
4. The upgrade from schema 1 refuses (``StoreSchemaMarkError``) a store marked schema 1, or not
   marked, that holds a row with a binding or the unbound mark, a legacy list, or a span record
   of a version above ``SCHEMA_1_SPAN_VERSION``: only a later schema writes those, so its mark
   was damaged, and upgrading would list damaged rows as old ones (enforced by both backends'
   ``_open_schema``; the rule is ``seqkv.store.backends.base.refuse_schema_1``). A store
   holding none of them is indistinguishable from one of schema 1 (assumed: not forged).

Nothing here mutates anything.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import NewType

from seqkv.digests import Digest, tokens_digest
from seqkv.store.ids import NamespaceKey, SessionName, SpanId

BINDING_BYTES = 16
Binding = NewType("Binding", bytes)
"""``BINDING_BYTES`` bytes of a domain-separated SHA-256 (``session_binding``)."""

UNBOUND = b""
"""The binding a backend reads for a row of schema 1 (the directory's empty blob, Redis' ``-``):
accepted only for a row on the legacy list (invariant 2)."""

STORE_SCHEMA = 3
"""The store's schema version: 2 binds each session row (1, implied when none is recorded, did
not); 3 keeps the legacy list of the rows the upgrade from 1 found (invariant 2). Both backends
record it; a store of a later version is refused, one of version 1 or 2 upgraded on open."""

SCHEMA_1_SPAN_VERSION = 1
"""The span record version (``seqkv.formats.span``) of every record in a store of schema 1: the
releases that wrote schema 1 wrote no other (the committed ``tests/data/store-v1``)."""


def record_version(head: int) -> int:
    """The version of a span record whose first byte is ``head``: every version keeps it in the
    byte's high nibble (``seqkv.formats.span.read_frame`` reads it first).

    >>> record_version(0x2B)
    2
    """
    return head >> 4

_DOMAIN = b"seqkv.store.binding.v1\x00"
_FIELDS = struct.Struct("<HQQB")


def session_binding(ns: NamespaceKey, name: SessionName, length: int, span: SpanId,
                    tokens: Sequence[int], kv_digest: bytes | None) -> Binding:
    """The binding of the row that names ``span`` (whose record holds ``kv_digest``) as the end
    of session ``name``, whose ``length`` tokens are ``tokens`` (invariant 1).

    >>> session_binding(NamespaceKey(bytes(16)), SessionName("s"), 2, SpanId(1), [5, 6],
    ...                 None).hex()
    '671257d6d7597ab7ed6fa6590ac1dd1d'
    """
    return digest_binding(ns, name, length, span, tokens_digest(tokens), kv_digest)


def digest_binding(ns: NamespaceKey, name: SessionName, length: int, span: SpanId,
                   tokens: Digest, kv_digest: bytes | None) -> Binding:
    """``session_binding`` of the tokens whose digest (``seqkv.digests.tokens_digest``) is
    ``tokens``: what a reader that holds the digest and not the tokens compares.

    >>> digest_binding(NamespaceKey(bytes(16)), SessionName("s"), 2, SpanId(1),
    ...                tokens_digest([5, 6]), None).hex()
    '671257d6d7597ab7ed6fa6590ac1dd1d'
    """
    encoded = name.encode("ascii")
    kv = b"" if kv_digest is None else kv_digest
    fields = _FIELDS.pack(len(encoded), length, span, len(kv))
    payload = _DOMAIN + ns + fields + encoded + tokens + kv
    return Binding(hashlib.sha256(payload).digest()[:BINDING_BYTES])

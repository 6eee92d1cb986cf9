"""A session row bound to what it names: the digest that makes a damaged row a refusal.

Motivation: a span's record carries the digests of its chain's tokens and KV, and every decode
verifies them, but the session row that says which span ends a session and how many of its
tokens the session holds was trusted as read. A row whose length was lowered, or that points at
another session's span, or over whose span another span's record was copied, decoded without an
error to tokens of another session (issue 29). Each row now carries a binding: a digest over the
namespace's key, the session id, the length, the span it names, the digest of the session's
tokens and the KV digest its span's record holds, recorded when a put or an append commits the
row and compared on every read, once the chain's spans were decoded and verified against their
own digests (so the KV digest vouches for the KV the read returns).

What it catches: any change of a row's span or length, a row copied to another id or namespace,
a record file replaced by another span's (even one of the same tokens and another KV), metadata
damage of any kind that the decode survives.
What it does not: a writer with access to the store who recomputes the binding (the digest has
no key: it detects damage and misdirection, it does not authenticate a writer).

Invariants:
1. The binding is a pure function of (namespace key, session id, length, span id, tokens digest
   of the session's tokens, the KV digest of the span's record or none); computing it on a read
   costs one SHA-256 over the session's token ids and no pass over its KV (enforced:
   ``session_binding``).
2. A row written before the store's schema version 2 carries the ``UNBOUND`` mark, which the
   upgrade to version 2 writes on every older row: it is read as before, and reported by a deep
   audit until an append or a put rewrites it (enforced by ``seqkv.store.store``). A row with
   neither a binding nor the mark is refused, so that a row written by hand in the old form
   does not pass as an old row (enforced by ``seqkv.store.backends.base.session_entry``).

Nothing here mutates anything.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import NewType

from seqkv.digests import tokens_digest
from seqkv.store.ids import NamespaceKey, SessionName, SpanId

BINDING_BYTES = 16
Binding = NewType("Binding", bytes)
"""``BINDING_BYTES`` bytes of a domain-separated SHA-256 (``session_binding``)."""

UNBOUND = b""
"""The binding a backend reads for a row of schema 1 (the directory's empty blob, Redis' ``-``)."""

STORE_SCHEMA = 2
"""The store's schema version: 2 binds each session row (1, implied when none is recorded, did
not). Both backends record it; a store of a later version is refused, one of version 1 read."""

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
    encoded = name.encode("ascii")
    kv = b"" if kv_digest is None else kv_digest
    fields = _FIELDS.pack(len(encoded), length, span, len(kv))
    payload = _DOMAIN + ns + fields + encoded + tokens_digest(tokens) + kv
    return Binding(hashlib.sha256(payload).digest()[:BINDING_BYTES])

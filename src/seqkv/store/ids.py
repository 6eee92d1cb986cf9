"""Identifiers of the session store: session ids, namespaces, span ids and codec digests.

Session ids and namespaces come from users, so they are validated before they reach a backend
key or a SQL statement; span ids and codec digests are made by the store.

Invariants:
1. A valid session id or namespace is 1 to 128 characters of ``[A-Za-z0-9_.:@-]`` and does not
   start with ``.`` (enforced: ``check_session_id``, ``check_namespace``).
2. Backends never see a namespace's name, only ``namespace_key``: 16 bytes of a domain-separated
   SHA-256 of it, so every namespace gets keys of the same shape (enforced).
"""

from __future__ import annotations

import hashlib
import re
from typing import NewType

from seqkv.store.errors import InvalidSessionIdError

SessionName = NewType("SessionName", str)
"""A validated session id."""

StoreNamespace = NewType("StoreNamespace", str)
"""A validated namespace (tenant)."""

NamespaceKey = NewType("NamespaceKey", bytes)
"""16 bytes that stand for a namespace inside a backend."""

SpanId = NewType("SpanId", int)
"""A stored span, unique within its namespace and never reused (ids only grow)."""

CodecDigest = NewType("CodecDigest", str)
"""SHA-256 (hex) of a codec's canonical description."""

MAX_ID_LENGTH = 128
_ID = re.compile(r"[A-Za-z0-9_:@-][A-Za-z0-9_.:@-]{0,127}")
_NAMESPACE_DOMAIN = b"seqkv.store.namespace.v1\x00"


def _check(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidSessionIdError(f"a {what} is a str, got {type(value).__name__}")
    if _ID.fullmatch(value) is None:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise InvalidSessionIdError(
            f"{what} {shown!r} is not valid: use 1 to {MAX_ID_LENGTH} characters of letters, "
            "digits and _ . : @ -, not starting with '.'"
        )
    return value


def check_session_id(value: object) -> SessionName:
    """``value`` as a ``SessionName``, or ``InvalidSessionIdError``.

    >>> check_session_id("user-7:chat.3")
    'user-7:chat.3'
    """
    return SessionName(_check(value, "session id"))


def check_namespace(value: object) -> StoreNamespace:
    """``value`` as a ``StoreNamespace``, or ``InvalidSessionIdError``."""
    return StoreNamespace(_check(value, "namespace"))


def namespace_key(namespace: StoreNamespace) -> NamespaceKey:
    """The 16 bytes a backend files the namespace's keys under (invariant 2)."""
    return NamespaceKey(hashlib.sha256(_NAMESPACE_DOMAIN + namespace.encode()).digest()[:16])

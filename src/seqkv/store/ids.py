"""Identifiers of the session store: session ids, tenants, span ids and codec digests.

Session ids and namespaces come from users, so they are validated by the one rule of
``seqkv.namespaces`` before they reach a backend key or a SQL statement; span ids and codec
digests are made by the store.

Invariants:
1. Backends never see a namespace's name, only its key: 16 bytes of a domain-separated SHA-256
   of it, so every namespace gets keys of the same shape (enforced: ``Tenant``).
2. A bad session id or namespace raises ``InvalidSessionIdError``, one of another type
   ``InvalidArgumentTypeError`` (enforced).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NewType

from seqkv.namespaces import Namespace, check_name
from seqkv.namespaces import check_namespace as check_any_namespace
from seqkv.store.errors import InvalidSessionIdError

SessionName = NewType("SessionName", str)
"""A validated session id."""

StoreNamespace = Namespace
"""A validated namespace (tenant)."""

NamespaceKey = NewType("NamespaceKey", bytes)
"""16 bytes that stand for a namespace inside a backend."""

SpanId = NewType("SpanId", int)
"""A stored span, unique within its namespace and never reused (ids only grow)."""

CodecDigest = NewType("CodecDigest", str)
"""SHA-256 (hex) of a codec's canonical description."""

_NAMESPACE_DOMAIN = b"seqkv.store.namespace.v1\x00"


def check_session_id(value: object) -> SessionName:
    """``value`` as a ``SessionName``, or ``InvalidSessionIdError``.

    >>> check_session_id("user-7:chat.3")
    'user-7:chat.3'
    """
    return SessionName(check_name(value, "session id", InvalidSessionIdError))


def check_namespace(value: object) -> StoreNamespace:
    """``value`` as a namespace, or ``InvalidSessionIdError``."""
    return check_any_namespace(value, InvalidSessionIdError)


def namespace_key(namespace: StoreNamespace) -> NamespaceKey:
    """The 16 bytes a backend files the namespace's keys under (invariant 1)."""
    return NamespaceKey(hashlib.sha256(_NAMESPACE_DOMAIN + namespace.encode()).digest()[:16])


@dataclass(frozen=True, slots=True)
class Tenant:
    """A namespace as the store uses it: its checked name and its backend key."""

    name: StoreNamespace
    key: NamespaceKey

    @classmethod
    def of(cls, namespace: object) -> Tenant:
        name = check_namespace(namespace)
        return cls(name, namespace_key(name))

"""One rule for names users give: namespaces (tenants) of the trie, the store and mixing
dictionaries, and the store's session ids.

A name reaches backend keys, SQL statements, file contents and error messages, so it is checked
before anything uses it, by the same rule everywhere.

Invariants:
1. A valid session id is 1 to ``MAX_ID_LENGTH`` characters of ``[A-Za-z0-9_.:@-]`` not
   starting with ``.``; a valid namespace is the same, or empty (the default namespace of
   callers that do not separate tenants) (enforced: ``check_session_id``, ``check_namespace``;
   anything else raises the caller's ``InvalidNameError`` class).
2. This module imports only the standard library and ``seqkv.errors`` and ``seqkv.limits``
   (enforced by ``tests/test_layering.py``).
"""

from __future__ import annotations

import re
from typing import NewType

from seqkv.errors import InvalidArgumentTypeError, InvalidNameError
from seqkv.limits import MAX_ID_LENGTH

Namespace = NewType("Namespace", str)
"""A validated tenant name: sessions of different namespaces never share a prefix, a span or a
dictionary."""

DEFAULT_NAMESPACE = Namespace("")
"""The namespace of callers that do not separate tenants."""

_ID = re.compile(rf"[A-Za-z0-9_:@-][A-Za-z0-9_.:@-]{{0,{MAX_ID_LENGTH - 1}}}")


def check_name(value: object, what: str, error: type[InvalidNameError] = InvalidNameError,
               empty: bool = False) -> str:
    """``value`` if it follows the rule (module invariant 1), else ``error`` naming ``what``.

    >>> check_name("user-7:chat.3", "session id")
    'user-7:chat.3'
    """
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(f"a {what} is a str, got {type(value).__name__}")
    if (value == "" and empty) or _ID.fullmatch(value) is not None:
        return value
    shown = value if len(value) <= 40 else value[:40] + "..."
    raise error(f"{what} {shown!r} is not valid: use 1 to {MAX_ID_LENGTH} characters of "
                "letters, digits and _ . : @ -, not starting with '.'"
                + (" (or the empty default namespace)" if empty else ""))


def check_namespace(value: object,
                    error: type[InvalidNameError] = InvalidNameError) -> Namespace:
    """``value`` as a ``Namespace`` (the empty default included), or ``error``."""
    return Namespace(check_name(value, "namespace", error, empty=True))

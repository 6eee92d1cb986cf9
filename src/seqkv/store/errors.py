"""Errors of the session store, one class per problem, all ``SeqKVError``s.

A read in the wrong namespace and a read of a session that never existed raise the same
``SessionNotFoundError`` with the same message (invariant 3 of ``seqkv.store.store``), so an error
never tells one tenant that another tenant's session exists.
"""

from __future__ import annotations

from seqkv.errors import CorruptRecordError, InputTooLongError, InvalidNameError, StoreError

__all__ = ["CorruptRecordError", "StoreError"]


class InvalidSessionIdError(StoreError, InvalidNameError):
    """A session id or namespace that breaks the length or character rules."""


class SessionNotFoundError(StoreError, KeyError):
    """No session of that id in that namespace (whatever other namespaces hold)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "session not found"


class SessionExistsError(StoreError):
    """``put`` of a session id that the namespace already holds."""


class ConcurrentUpdateError(StoreError):
    """Another writer changed the session between this call's read and its commit."""


class StoreVerificationError(StoreError):
    """Decoding a stored span gave tokens or KV other than those its digest vouches for."""


class CodecMismatchError(StoreError):
    """A span was coded by a codec (model, profile, level) that this worker does not have."""


class StoreUnavailableError(StoreError):
    """The backend (a directory or a Redis server) cannot be reached or opened."""


class BatchInputError(StoreError, ValueError):
    """A line of a JSON-lines batch file that is not a valid session."""


class DictionaryNamespaceError(StoreError, ValueError):
    """A mixing dictionary built for another namespace than the one it is put into."""


class StoreSchemaError(StoreError):
    """A store written by a later seqkv (its schema version is above the one this seqkv
    reads)."""


class StoreSchemaMarkError(StoreSchemaError, CorruptRecordError):
    """A store whose schema mark says 1 (or is missing) while it holds what only a later schema
    writes (a row with a binding or the unbound mark, a list of legacy rows, a span record of
    version 2 or later): the mark was damaged, and upgrading would take damaged rows for rows
    of schema 1, so the store is refused."""


class SessionTooLongError(StoreError, InputTooLongError):
    """A stored session (or a span of its chain) claims more tokens than the caller's
    ``max_tokens`` (default: the model's context): refused before any forward."""


class StoreDamagedError(StoreError):
    """``gc`` on a store whose audit finds malformed rows or records: collecting garbage from
    damaged metadata could delete what a session needs."""

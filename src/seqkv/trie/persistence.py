"""Trie snapshots (``\\x89SKT``, formats 1 and 2) are retired: reading one is a named error.

Motivation: the prefix a worker keeps in memory is a radix trie (``seqkv.trie.cache``) over the
chains of a ``SessionStore``, and the store's chain of spans, coded under the model, is its
persistent form: a second persisted prefix tree (this format stored node KV as byte planes and
zlib, not with seqkv's own coding) is not kept. Nothing writes a snapshot; a reader given one
says how to rebuild what it held: put its sessions into a store (``SessionStore.put``), and pin
the prefixes ``.skv`` files name (``SessionStore.pin_prefix``).

Invariants:
1. Bytes that start with the snapshot magic raise ``TrieSnapshotRetiredError`` before anything
   else is read (enforced; tested with snapshots of both formats written by the last writer).
2. Other bytes raise ``NotATrieFileError``, empty ones ``EmptyInputError`` (enforced).
"""

from __future__ import annotations

import os
from typing import NoReturn

from seqkv.errors import EmptyInputError
from seqkv.trie.errors import NotATrieFileError, TrieSnapshotRetiredError

MAGIC = b"\x89SKT"  # formats 1 (followed by b"\r\n\x1a\n") and 2 (by the version byte)


def is_trie_snapshot(data: bytes) -> bool:
    """Whether ``data`` starts like a trie snapshot of any format."""
    return data[: len(MAGIC)] == MAGIC


def trie_from_bytes(data: bytes) -> NoReturn:
    """Refuse a trie snapshot by name (invariants 1 and 2)."""
    if not data:
        raise EmptyInputError("the trie file is empty")
    if not is_trie_snapshot(data):
        raise NotATrieFileError("not a trie snapshot: it does not start with \\x89SKT")
    raise TrieSnapshotRetiredError(
        "trie snapshots are retired: a SessionStore's chain of spans is the prefix trie's "
        "persistent form. Rebuild from the sessions: put them into a store "
        "(SessionStore.put or `seqkv store put`), and pin the prefixes .skv files name with "
        "SessionStore.pin_prefix; decompress such files with "
        "prefixes=store.prefix_source(namespace=...)")


def load_trie(path: str | os.PathLike[str]) -> NoReturn:
    """Refuse the trie snapshot at ``path`` by name (reads only its first bytes)."""
    with open(path, "rb") as handle:
        trie_from_bytes(handle.read(len(MAGIC)))

"""Identifiers of the prefix trie: namespaces, node and session ids, and content hashes of prefixes.

Motivation: a ``.skv`` file that codes only a session's tail must name the prefix it continues, in
a way that survives the trie being split, saved, loaded or rebuilt on another machine. A prefix is
therefore named by its content: a SHA-256 over the namespace and the prefix's tokens, never by a
node id (ids are local to one trie object and change across splits and loads).

The hash is the one block hash (``seqkv.blockhash``) of the whole prefix as one block, rooted at
the namespace's text::

    hash_block_tokens(namespace_root(ns), t_1 .. t_k)
      = SHA-256( b"seqkv.trie.prefix.v1\\0" || u32le(len(ns)) || ns (UTF-8) || t_1 .. t_k (i64le) )

the bytes ``.skv`` files of format 5 persist as their ``prefix_hash`` field (data of that format:
the construction cannot change without a format version). One block, not a chain: a chain's
value depends on its block boundaries, and the trie's node boundaries move when edges split.

Invariants:
1. ``prefix_hash`` depends only on the namespace and the token values, not on how the trie
   happens to split its edges (enforced: it never sees the trie).
2. Distinct namespaces give distinct hashes for the same tokens: the namespace is length-prefixed,
   so no namespace/token boundary is ambiguous (enforced by the encoding).
3. Collisions are assumed not to happen (SHA-256); ``PrefixTrie.resolve`` still re-hashes the
   tokens it returns and refuses them if they differ (checked at every resolve).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NewType

import numpy as np
import numpy.typing as npt

from seqkv.blockhash import hash_block_tokens, namespace_root
from seqkv.namespaces import DEFAULT_NAMESPACE as DEFAULT_NAMESPACE
from seqkv.namespaces import Namespace as Namespace
from seqkv.namespaces import check_namespace as check_any_namespace
from seqkv.session import PrefixHash as PrefixHash
from seqkv.trie.errors import InvalidPrefixHashError
from seqkv.trie.inputs import as_token_array

NodeId = NewType("NodeId", int)
"""A node's id, unique within one ``PrefixTrie`` object (not across saves and loads)."""

SessionId = NewType("SessionId", int)
"""A locked session: the nodes of its path are never evicted until it is released."""


_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def prefix_hash(
    namespace: Namespace, tokens: Sequence[int] | npt.NDArray[np.integer]
) -> PrefixHash:
    """The content hash of ``tokens`` in ``namespace``.

    >>> prefix_hash(DEFAULT_NAMESPACE, [1, 2, 3])[:16]
    'f71e03c58f38137b'
    >>> prefix_hash(Namespace("tenant-a"), [1, 2, 3]) == prefix_hash(DEFAULT_NAMESPACE, [1, 2, 3])
    False
    """
    return prefix_hash_of_array(namespace, as_token_array(tokens, allow_empty=True))


def prefix_hash_of_array(namespace: Namespace, tokens: npt.NDArray[np.int64]) -> PrefixHash:
    """``prefix_hash`` of an already validated 1-D int64 token array."""
    return PrefixHash(hash_block_tokens(namespace_root(namespace), tokens).hex())


def check_prefix_hash(value: str) -> PrefixHash:
    """``value`` as a ``PrefixHash``, or ``InvalidPrefixHashError`` if it cannot be one."""
    if not isinstance(value, str) or _HEX_DIGEST.fullmatch(value) is None:
        raise InvalidPrefixHashError(
            f"{value!r} is not a prefix hash: expected 64 lowercase hexadecimal digits, as "
            "returned by prefix_hash() or PrefixTrie.match()"
        )
    return PrefixHash(value)


def check_namespace(value: object) -> Namespace:
    """``value`` as a ``Namespace`` by the one rule of ``seqkv.namespaces`` (the empty default
    included); anything else raises ``InvalidNameError``."""
    return check_any_namespace(value)

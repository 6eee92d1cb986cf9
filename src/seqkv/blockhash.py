"""The one prefix hash: chained block hashes over token ids, as vLLM's ``hash_block_tokens``.

Motivation: every prefix key in seqkv (the trie's prefix identity, the store's index keys, the
vLLM connector's warm-tier keys) names "these tokens, after this parent, in this context". One
construction, shaped like vLLM's ``kv_cache_utils.hash_block_tokens(hash_fn, parent_hash,
curr_block_token_ids, extra_keys)``, serves them all: a chain starts at a root that hashes its
context (``chain_root``: a domain and the parts that make the keys mean something, such as a
namespace key, a model digest, a layout, a tenant) and each step hashes the parent and one block
of tokens::

    root    = SHA-256( b"seqkv.blockhash.root.v1\\0" || for each of domain, parts...:
                                                         u32le(len) || bytes )
    h(p, b) = SHA-256( b"seqkv.trie.prefix.v1\\0" || u32le(len(p)) || p || b_1 .. b_k (i64le) )

A block may be any length, one token included (the store's blocks run between its sparse
positions 16, 32, 64, 128, 256, 512, ...; the connector's are vLLM's fixed block size), and the
hash of a chain at a block boundary depends on the tokens before it and on where the earlier
boundaries fell (so each user fixes its boundaries: positions, block size, or one block).

Why the step's tag is the trie's: ``.skv`` files of format 5 persist the prefix they continue as
``SHA-256(b"seqkv.trie.prefix.v1\\0" || u32le(len(ns)) || ns || tokens (i64le))`` (their
``prefix_hash`` field, ``seqkv.trie.keys``). That value is exactly ``h(namespace_root(ns),
tokens)``: the whole prefix as one block whose parent is the namespace's UTF-8 text. So the
trie's key is a value of this one hash, and every file written before it still resolves, with no
second reader and no format change. The trie hashes a whole prefix as one block, not a chain,
because its node boundaries move when edges split; the one-block value is split-independent.

Invariants:
1. ``hash_block_tokens(p, b)`` depends only on ``p`` and the token values of ``b`` (enforced): a
   key at a boundary depends on the tokens before it and the root, never on tokens after it.
2. The step's preimage is injective: the parent is length-prefixed and every token is 8 bytes,
   so no (parent, block) pair shares its bytes with another (enforced by the encoding).
3. Roots of different contexts differ: the domain and each part are length-prefixed under their
   own tag (enforced), so tenants, namespaces, models and layouts never share a chain. The
   trie's root is its namespace's text, not a digest (format 5 fixed it); the trie's values are
   only ever compared with the trie's, so they need no separation from other roots (assumed).
4. Token ids are integers in [-2^63, 2^63); anything else is ``InvalidTokensError``, never a
   silent wrap (enforced). Collisions are assumed not to happen (SHA-256); every user still
   treats a truncated key as a hint and compares tokens before it trusts a hit (checked by each).

>>> root = chain_root(b"example", b"tenant-a")
>>> chain = hash_block_chain(root, [1, 2, 3, 4, 5], [2, 5])
>>> chain[1] == hash_block_tokens(hash_block_tokens(root, [1, 2]), [3, 4, 5])
True
>>> hash_block_tokens(namespace_root(""), [1, 2, 3]).hex()[:16]
'f71e03c58f38137b'
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NewType

import numpy as np
import numpy.typing as npt

from seqkv.errors import InvalidNameError, InvalidTokensError

BlockHash = NewType("BlockHash", bytes)
"""A chain step's SHA-256 digest (``HASH_BYTES``): the key of every token before a boundary."""

ChainRoot = NewType("ChainRoot", bytes)
"""What a chain's first block hashes as its parent: ``chain_root`` or ``namespace_root``."""

HASH_BYTES = 32
_ROOT_TAG = b"seqkv.blockhash.root.v1\x00"
# NOTE: the tag format-5 ``.skv`` files' prefix identities were written with (module docstring).
_BLOCK_TAG = b"seqkv.trie.prefix.v1\x00"
_LENGTH_LIMIT = 1 << 32  # u32le length prefixes


def _length(data: bytes) -> bytes:
    if len(data) >= _LENGTH_LIMIT:
        raise InvalidTokensError(f"a hash input part of {len(data):,} bytes is longer than a u32 "
                                 "length prefix holds: pass a digest of it instead")
    return len(data).to_bytes(4, "little")


def chain_root(domain: bytes, *parts: bytes) -> ChainRoot:
    """The root of a chain in ``domain``, over ``parts`` (a namespace key, a model digest, a
    layout, a tenant, ...): equal exactly when the domain and every part are equal.

    >>> chain_root(b"d", b"ab", b"c") == chain_root(b"d", b"a", b"bc")
    False
    >>> chain_root(b"d", b"a").hex()[:16]
    '550ef9baa8b90815'
    """
    stream = hashlib.sha256(_ROOT_TAG)
    for part in (domain, *parts):
        stream.update(_length(part))
        stream.update(part)
    return ChainRoot(stream.digest())


def namespace_root(namespace: str) -> ChainRoot:
    """The trie's root for ``namespace``: its UTF-8 text, as format-5 files hash it."""
    try:
        return ChainRoot(namespace.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidNameError(f"namespace {namespace!r:.60} holds a lone surrogate, which "
                               "UTF-8 cannot encode: pass a namespace of valid text") from None


def token_bytes(tokens: Sequence[int] | npt.NDArray[np.integer]) -> bytes:
    """``tokens`` as the little-endian int64 bytes a step hashes (invariant 4)."""
    try:
        raw = np.asarray(tokens)
    except (OverflowError, ValueError) as error:
        raise InvalidTokensError(f"token ids must be integers in [-2^63, 2^63): {error}"
                                 ) from None
    if raw.size == 0:
        return b""
    if raw.ndim != 1 or raw.dtype.kind not in "iu":
        raise InvalidTokensError(f"token ids must be a 1-D sequence of integers, got shape "
                                 f"{raw.shape} of {raw.dtype}")
    if raw.dtype.kind == "u" and raw.dtype.itemsize == 8 and int(raw.max()) >= 2**63:
        raise InvalidTokensError("token ids must be below 2^63")
    return raw.astype("<i8", copy=False).tobytes()


def _step(parent: BlockHash | ChainRoot) -> bytes:
    """What a step hashes before its tokens: the tag and the length-prefixed parent."""
    return _BLOCK_TAG + _length(parent) + parent


def hash_block_tokens(parent: BlockHash | ChainRoot,
                      tokens: Sequence[int] | npt.NDArray[np.integer]) -> BlockHash:
    """The hash of the block ``tokens`` after ``parent`` (a root, or the previous block's hash).

    >>> root = chain_root(b"d", b"a")
    >>> hash_block_tokens(root, [1, 2, 3]).hex()[:16]
    '8774625a4577492b'
    >>> hash_block_tokens(root, [1, 2]) == hash_block_tokens(chain_root(b"d", b"b"), [1, 2])
    False
    """
    return BlockHash(hashlib.sha256(_step(parent) + token_bytes(tokens)).digest())


def hash_block_chain(parent: BlockHash | ChainRoot,
                     tokens: Sequence[int] | npt.NDArray[np.integer],
                     ends: Sequence[int]) -> list[BlockHash]:
    """The chain of ``hash_block_tokens`` over the blocks of ``tokens`` that end at ``ends``
    (strictly increasing, at most ``len(tokens)``; the first block starts at 0): the hash at
    each end, the last block's hash being the parent of the next.

    >>> root = chain_root(b"d", b"a")
    >>> hash_block_chain(root, [7, 8, 9], [1, 3]) == [
    ...     hash_block_tokens(root, [7]), hash_block_tokens(hash_block_tokens(root, [7]), [8, 9])]
    True
    """
    data = token_bytes(tokens)
    out: list[BlockHash] = []
    start = 0
    count = len(data) // 8
    for end in ends:
        if not start < end <= count:
            raise InvalidTokensError(f"block ends must increase within the {count} tokens: "
                                     f"{end} after {start}")
        stream = hashlib.sha256(_step(out[-1] if out else parent))
        stream.update(data[8 * start : 8 * end])
        out.append(BlockHash(stream.digest()))
        start = end
    return out

"""A store as the prefix source of ``.skv`` files: prefixes pinned by their content hash.

Motivation: a ``.skv`` file coded after a shared prefix names it by content hash
(``seqkv.trie.keys.prefix_hash`` of the namespace and the prefix's tokens) and needs its tokens
and KV back to decode. A store already holds every session's tokens and KV as a chain of spans,
so a prefix of a stored session is pinned as a session of its own: the row
``prefix:<hash>`` of the prefix's length, on the span holding its last token (a put the store
matches in full codes nothing and writes no record). The row is the index entry
``prefix_hash -> (span, length)``; it holds a reference to its chain, so deleting the session it
was cut from keeps the prefix.

Invariants:
1. ``resolve`` returns only tokens that hash to the asked hash in the source's namespace
   (enforced: re-hashed after the read; else ``PrefixHashMismatchError``), and the KV the store
   decoded for them (checked by the store's get: ``seqkv.store.store`` invariant 6).
2. An unknown hash is ``PrefixNotFoundError``, the trie's error for the same miss (enforced).
"""

from __future__ import annotations

from collections.abc import Callable

from seqkv.session import Prefix, PrefixHash
from seqkv.store.errors import SessionNotFoundError
from seqkv.store.ids import SessionName
from seqkv.trie.errors import PrefixHashMismatchError, PrefixNotFoundError
from seqkv.trie.keys import Namespace, check_prefix_hash
from seqkv.trie.keys import prefix_hash as content_hash

PIN_PREFIX = "prefix:"


def pin_name(hash_: PrefixHash) -> SessionName:
    """The session id a pinned prefix is stored under.

    >>> pin_name(PrefixHash("ab" * 32))[:12]
    'prefix:ababa'
    """
    return SessionName(PIN_PREFIX + hash_)


class StorePrefixSource:
    """The ``seqkv.skv.PrefixSource`` of one namespace of a store: ``resolve`` reads the
    pinned prefix (``SessionStore.pin_prefix``) by its hash."""

    def __init__(self, namespace: Namespace,
                 read: Callable[[SessionName], tuple[tuple[int, ...], Prefix]]) -> None:
        """``read(name)``: the tokens and prefix of the stored session ``name``, or
        ``SessionNotFoundError``."""
        self.namespace = namespace
        self._read = read

    def resolve(self, prefix_hash: PrefixHash, *, with_kv: bool = True) -> Prefix:
        """Tokens and KV of exactly the prefix ``prefix_hash`` names (invariants 1 and 2)."""
        wanted = check_prefix_hash(prefix_hash)
        try:
            tokens, prefix = self._read(pin_name(wanted))
        except SessionNotFoundError:
            raise PrefixNotFoundError(
                f"namespace {self.namespace!r} of the store pins no prefix with hash "
                f"{wanted[:16]}...: pin it (SessionStore.pin_prefix) from the session it was "
                "cut from, or pass the trie or store that holds it") from None
        if content_hash(self.namespace, tokens) != wanted:
            raise PrefixHashMismatchError(
                f"the store's pinned prefix {wanted[:16]}... holds tokens that hash to "
                "something else: its row was damaged or copied from another namespace")
        return Prefix(tokens, prefix.kv if with_kv else None, wanted)

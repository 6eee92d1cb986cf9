"""Cache keys of warm blocks: seqkv's own prefix hashes, never vLLM's.

Motivation: vLLM's block hashes are seeded per process (``PYTHONHASHSEED`` or a random seed), so
an entry keyed by them would never hit after a restart. A warm block's key is the chain of the
one block hash (``seqkv.blockhash``, vLLM's ``hash_block_tokens`` shape) over the request's
full blocks, rooted at everything that makes the blocks' bytes mean something::

    root  = chain_root("seqkv-warm/2", model digest, KV dtype, block size, layout,
                       warm config bytes, tenant)
    key_i = hash_block_tokens(key_{i-1}, tokens of block i)      (key_{-1} = root; 32 bytes)

The key is the whole ``BlockHash``, so the scheduler extends a request's chain from its last
key. Entries written under an earlier key scheme (``seqkv-warm/1``: 16-byte keys) are files of
another name: they are never looked up, so they miss as a cache does, and the tier's LRU
eviction deletes them like any cold entry (``WarmTier``); no key or tag check reads them.

Invariants:
1. ``key_i`` depends on every token of blocks ``0..i``, the model, the KV dtype, the block size,
   the paged layout, the warm config and the tenant; changing any changes every key (enforced by
   construction; checked: ``tests/test_vllm_connector.py``).
2. Two tenants never share a key: the tenant is hashed into the root with its length, so no
   tenant name is a prefix trick on another (enforced).
3. Keys are pure functions of their inputs: equal across processes and restarts (enforced: no
   process-seeded hash is used).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from seqkv.blockhash import HASH_BYTES, BlockHash, ChainRoot, chain_root, hash_block_chain
from seqkv.digests import DIGEST_BYTES, Digest

KEY_BYTES = HASH_BYTES
_DOMAIN = b"seqkv-warm/2"


@dataclass(frozen=True)
class KeySpace:
    """What a warm block's bytes depend on besides its tokens (invariant 1)."""

    model_digest: bytes
    kv_dtype: str
    block_size: int
    layout: str
    warm_config: bytes

    def root(self, tenant: str) -> ChainRoot:
        return chain_root(_DOMAIN, self.model_digest, self.kv_dtype.encode(),
                          str(self.block_size).encode(), self.layout.encode(), self.warm_config,
                          tenant.encode())

    def block_keys(self, tokens: Sequence[int], tenant: str, start: int = 0,
                   parent: bytes | None = None) -> list[BlockHash]:
        """Keys of the full blocks of ``tokens`` from block ``start`` on (``parent``: the key of
        block ``start - 1``, required when ``start > 0``).

        >>> space = KeySpace(b"m" * 8, "bfloat16", 2, "cpu", b"c")
        >>> a = space.block_keys([1, 2, 3, 4, 5], "t")
        >>> len(a), a == space.block_keys([1, 2, 3, 4], "t")
        (2, True)
        >>> a == space.block_keys([1, 2, 3, 4], "u")
        False
        >>> space.block_keys([1, 2, 3, 4], "t", start=1, parent=a[0]) == a[1:]
        True
        >>> a[0].hex()[:16]
        'e4f68e823c02ad57'
        """
        if start and (parent is None or len(parent) != KEY_BYTES):
            raise ValueError(f"block_keys from a later block needs its parent's {KEY_BYTES}-byte "
                             "key (as block_keys returned it)")
        first = self.root(tenant) if start == 0 else BlockHash(bytes(parent or b""))
        full = len(tokens) // self.block_size
        if start >= full:
            return []
        size = self.block_size
        ends = [(index + 1 - start) * size for index in range(start, full)]
        return hash_block_chain(first, tokens[start * size : full * size], ends)


def entry_tag(key: bytes) -> Digest:
    """The tag a warm entry stores for ``key`` (checked on every load)."""
    return Digest(key[:DIGEST_BYTES])


def folder_digest(path: str | Path) -> bytes:
    """A model folder's digest: its config, tokenizer and weight files' bytes, in name order
    (what vLLM loads), so it is the same in every process that serves the folder."""
    folder = Path(path)
    h = hashlib.sha256()
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and (
        p.suffix in (".safetensors", ".json", ".model", ".txt")))
    for name in names:
        h.update(name.encode() + b"\0")
        with (folder / name).open("rb") as handle:
            while chunk := handle.read(1 << 22):
                h.update(chunk)
    return h.digest()[:DIGEST_BYTES]

"""Cache keys of warm blocks: seqkv's own prefix hashes, never vLLM's.

Motivation: vLLM's block hashes are seeded per process (``PYTHONHASHSEED`` or a random seed), so
an entry keyed by them would never hit after a restart. A warm block's key is a chain hash over
the request's tokens, rooted at a digest of everything that makes its bytes mean something:

    root     = sha256("seqkv-warm/1" | model digest | KV dtype | block size | layout
                      | warm config bytes | tenant)
    key_i    = sha256(key_{i-1} | tokens of block i as little-endian int32)[:16]

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

import numpy as np

from seqkv.digests import DIGEST_BYTES, Digest

KEY_BYTES = 16
_DOMAIN = b"seqkv-warm/1"


@dataclass(frozen=True)
class KeySpace:
    """What a warm block's bytes depend on besides its tokens (invariant 1)."""

    model_digest: bytes
    kv_dtype: str
    block_size: int
    layout: str
    warm_config: bytes

    def root(self, tenant: str) -> bytes:
        h = hashlib.sha256(_DOMAIN)
        for part in (self.model_digest, self.kv_dtype.encode(), str(self.block_size).encode(),
                     self.layout.encode(), self.warm_config, tenant.encode()):
            h.update(len(part).to_bytes(4, "little"))
            h.update(part)
        return h.digest()[:KEY_BYTES]

    def block_keys(self, tokens: Sequence[int], tenant: str, start: int = 0,
                   parent: bytes | None = None) -> list[bytes]:
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
        """
        if start and parent is None:
            raise ValueError("block_keys from a later block needs its parent key")
        key = self.root(tenant) if start == 0 else parent
        assert key is not None
        out = []
        full = len(tokens) // self.block_size
        array = np.asarray(tokens[: full * self.block_size], dtype="<i4")
        for index in range(start, full):
            block = array[index * self.block_size : (index + 1) * self.block_size]
            key = hashlib.sha256(key + block.tobytes()).digest()[:KEY_BYTES]
            out.append(key)
        return out


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

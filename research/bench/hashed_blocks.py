"""The baseline: vLLM-style automatic prefix caching with hashed fixed-size blocks.

Motivation: the prefix trie is measured against what serving engines ship. vLLM's automatic
prefix caching splits every request into blocks of ``block_size`` tokens and keys each full block
by ``hash(parent block's hash, the block's tokens, extra keys)``, so equal prefixes map to equal
chains of hashes. Only full blocks are shared; a request's last, partial block is private. Blocks
carry reference counts; a block whose count drops to 0 stays cached in a free queue and is reused,
least recently freed first, when a new block is needed (LRU). This module follows that description
(``/work/shared/ANCHORS.md``); it stores no KV, it counts blocks and bytes.

Details, as in vLLM:
- The extra key (here the namespace, vLLM's ``cache_salt``) enters the first block's hash only;
  the chain carries it to every later block.
- A request frees its blocks tail first, so that its tail is evicted before its prefix.
- Memory is allocated in whole blocks: a partial last block occupies ``block_size`` slots.

One difference: vLLM caps a hit at ``len(tokens) - 1`` because it must run the model on at least
one token to sample from; a KV store has no such need, so neither this cache nor the trie caps.

Invariants:
1. A block is in the free queue iff its reference count is 0 and it holds a cached hash
   (enforced); blocks without a hash are returned to the pool at once when freed.
2. ``used_blocks <= capacity_blocks`` unless every block is referenced when a new one is needed,
   which ``stats().over_capacity_blocks`` counts; releases shrink back to the capacity
   (enforced).
3. Not thread-safe: it is a single-threaded benchmark baseline (assumed).
4. Hashes are SHA-256 over the parent hash, the block's tokens as int64 little-endian and the
   extra key; collisions are assumed not to happen.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

import numpy as np
import numpy.typing as npt

from seqkv.trie.errors import TrieConfigError, UnknownSessionError
from seqkv.trie.inputs import as_token_array
from seqkv.trie.keys import DEFAULT_NAMESPACE, Namespace

BlockHash = NewType("BlockHash", bytes)
BlockId = NewType("BlockId", int)
BlockSessionId = NewType("BlockSessionId", int)

VLLM_BLOCK_SIZE = 16  # vLLM's default block size on GPU
_ROOT_HASH = BlockHash(hashlib.sha256(b"seqkv.trie.hashed-blocks.v1").digest())


@dataclass(slots=True, eq=False)
class Block:
    block_id: BlockId
    block_hash: BlockHash | None  # set for full blocks, which can be shared
    ref_count: int = 0


@dataclass(frozen=True, slots=True)
class BlockAllocation:
    session: BlockSessionId
    length: int
    hit_tokens: int  # tokens in leading full blocks found cached
    blocks: int  # blocks the session holds
    evicted_blocks: int  # cached blocks this allocation reused


@dataclass(frozen=True, slots=True)
class HashedBlockStats:
    sessions: int
    tokens: int
    hit_tokens: int
    evicted_blocks: int
    over_capacity_blocks: int
    used_blocks: int  # referenced or cached
    cached_blocks: int  # with a hash, looked up by later requests
    bytes_stored: int  # used_blocks x block_size x bytes_per_token

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.tokens if self.tokens else 0.0


def block_hashes(
    tokens: npt.NDArray[np.int64], block_size: int, namespace: Namespace
) -> list[BlockHash]:
    """The chained hashes of the full blocks of ``tokens``.

    >>> len(block_hashes(np.arange(40, dtype=np.int64), 16, DEFAULT_NAMESPACE))
    2
    """
    salt = namespace.encode("utf-8")
    parent = _ROOT_HASH
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        stream = hashlib.sha256(parent)
        stream.update(tokens[start : start + block_size].astype("<i8", copy=False).tobytes())
        if start == 0:
            stream.update(struct.pack("<I", len(salt)) + salt)
        parent = BlockHash(stream.digest())
        hashes.append(parent)
    return hashes


class HashedBlockCache:
    """Ref-counted hashed blocks with an LRU free queue, sized in blocks."""

    def __init__(
        self,
        *,
        block_size: int = VLLM_BLOCK_SIZE,
        capacity_blocks: int | None = None,
        bytes_per_token: int,
    ) -> None:
        if block_size < 1:
            raise TrieConfigError(f"block_size must be >= 1, got {block_size}")
        if capacity_blocks is not None and capacity_blocks < 0:
            raise TrieConfigError(f"capacity_blocks must be None or >= 0, got {capacity_blocks}")
        if bytes_per_token < 0:
            raise TrieConfigError(f"bytes_per_token must be >= 0, got {bytes_per_token}")
        self._block_size = block_size
        self._capacity = capacity_blocks
        self._bytes_per_token = bytes_per_token
        self._cached: dict[BlockHash, Block] = {}
        self._free: OrderedDict[BlockId, Block] = OrderedDict()  # head = least recently freed
        self._sessions: dict[BlockSessionId, list[Block]] = {}
        self._used = 0
        self._next_block = 0
        self._next_session = 0
        self._tokens = 0
        self._hit_tokens = 0
        self._evicted = 0
        self._over_capacity = 0

    @classmethod
    def with_budget(
        cls, budget_bytes: int | None, *, bytes_per_token: int, block_size: int = VLLM_BLOCK_SIZE
    ) -> HashedBlockCache:
        """A cache holding as many whole blocks as ``budget_bytes`` pays for."""
        capacity = None if budget_bytes is None else budget_bytes // (block_size * bytes_per_token)
        return cls(block_size=block_size, capacity_blocks=capacity, bytes_per_token=bytes_per_token)

    @property
    def block_size(self) -> int:
        return self._block_size

    def match(
        self, tokens: Sequence[int] | npt.NDArray[np.integer], *,
        namespace: Namespace = DEFAULT_NAMESPACE,
    ) -> int:
        """Tokens of the longest cached run of leading full blocks; mutates nothing."""
        query = as_token_array(tokens, allow_empty=True)
        return self._hit_blocks(block_hashes(query, self._block_size, namespace)) * self._block_size

    def allocate(
        self, tokens: Sequence[int] | npt.NDArray[np.integer], *,
        namespace: Namespace = DEFAULT_NAMESPACE,
    ) -> BlockAllocation:
        """Admit a request: reuse its cached leading blocks, allocate the rest, cache full ones."""
        query = as_token_array(tokens, allow_empty=False)
        hashes = block_hashes(query, self._block_size, namespace)
        hits = self._hit_blocks(hashes)
        held = [self._cached[h] for h in hashes[:hits]]
        for block in held:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1
        needed = -(-len(query) // self._block_size) - hits
        evicted = 0
        for index in range(hits, hits + needed):
            block, reused = self._new_block()
            evicted += reused
            block.ref_count = 1
            if index < len(hashes) and hashes[index] not in self._cached:
                block.block_hash = hashes[index]
                self._cached[hashes[index]] = block
            held.append(block)
        self._next_session += 1
        session = BlockSessionId(self._next_session)
        self._sessions[session] = held
        self._tokens += len(query)
        self._hit_tokens += hits * self._block_size
        return BlockAllocation(session=session, length=len(query),
                               hit_tokens=hits * self._block_size, blocks=len(held),
                               evicted_blocks=evicted)

    def release(self, session: BlockSessionId) -> None:
        """Free a request's blocks, tail first: cached ones join the free queue's tail."""
        blocks = self._sessions.pop(session, None)
        if blocks is None:
            raise UnknownSessionError(f"block session {session!r} is not held by this cache")
        for block in reversed(blocks):
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is None:
                    self._used -= 1
                else:
                    self._free[block.block_id] = block
        while self._capacity is not None and self._used > self._capacity and self._free:
            self._drop_free_head()

    def stats(self) -> HashedBlockStats:
        return HashedBlockStats(
            sessions=self._next_session, tokens=self._tokens, hit_tokens=self._hit_tokens,
            evicted_blocks=self._evicted, over_capacity_blocks=self._over_capacity,
            used_blocks=self._used, cached_blocks=len(self._cached),
            bytes_stored=self._used * self._block_size * self._bytes_per_token,
        )

    def _hit_blocks(self, hashes: list[BlockHash]) -> int:
        for index, block_hash in enumerate(hashes):
            if block_hash not in self._cached:
                return index
        return len(hashes)

    def _new_block(self) -> tuple[Block, int]:
        """A block for new tokens, and 1 if a cached block was evicted for it."""
        if self._capacity is not None and self._used >= self._capacity:
            if self._free:
                block = self._drop_free_head()
                self._used += 1
                return block, 1
            self._over_capacity += 1
        self._used += 1
        self._next_block += 1
        return Block(block_id=BlockId(self._next_block), block_hash=None), 0

    def _drop_free_head(self) -> Block:
        """Evict the least recently freed cached block; it leaves the used count."""
        _, block = self._free.popitem(last=False)
        if block.block_hash is not None:
            del self._cached[block.block_hash]
        block.block_hash = None
        self._evicted += 1
        self._used -= 1
        return block

"""The worker side of the connector: warm loads into the paged cache, saves off the forward path.

Motivation: vLLM's workers hold the paged KV of every layer. Before a step's forward the
connector writes the planned warm blocks into it (``start_load_kv``); after the forward it copies
the step's newly full blocks out (``wait_for_save``) and codes them on a background thread, so
the forward never waits for the coder. This module does that without importing vLLM.

Invariants:
1. A load decodes only entries that pass every check of ``seqkv.warm.entry`` (checksum, model,
   tag = the block's key, geometry, the connector's coding and dtype, payload length, finite
   scales; an exact entry's values against its digest); every block whose entry is
   missing or fails is reported by ``take_load_errors`` and never written with wrong KV: the
   engine recomputes it (enforced; checked by the driver with corrupted entries). An entry
   that was read and failed is deleted, so later requests do not match it and fail again; the
   recompute saves the block anew (enforced; checked by the driver).
2. Saves skip every request whose load failed in the same step (its new blocks were computed
   over invalid KV) (enforced). Saves copy the blocks out of the paged cache inside ``save``
   (before the engine can free or reuse them), then code and write them on one background
   thread at the lowest CPU priority; ``save`` never waits for coding. When more than
   ``max_pending`` batches are queued the new batch is dropped and counted: a dropped save is
   only a future miss (enforced).
3. Eviction runs on the background thread after writes and never deletes a key the plan
   protects (enforced by ``WarmTier.evict``).
4. KV reaches the paged cache in the cache's own dtype and layout (enforced: ``PagedLayout``).
5. A block is coded once while its entry exists: a save skips keys already queued and keys
   the tier holds, so two requests of one prompt code it once, in one step or in steps
   either side of the first write (enforced; checked by the driver and under vLLM,
   ``tests/test_vllm_e2e.py``).
6. In the exact mode the entries hold the cache dtype's bits and nothing is converted on
   either side: a load writes the bits the engine computed (enforced: ``register`` refuses a
   cache of another dtype than the coding's; checked by the driver, logits equal bit for bit).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from seqkv.errors import ConnectorConfigError, SeqKVError
from seqkv.integrations.vllm.background import BackgroundQueue
from seqkv.integrations.vllm.keys import entry_tag
from seqkv.integrations.vllm.paged import PagedLayout
from seqkv.integrations.vllm.plan import StepPlan
from seqkv.integrations.vllm.warm_tier import WarmTier
from seqkv.warm import EntryConfig, ExactConfig, WarmModel, segment_codec
from seqkv.warm.entry import EntryHeader, read_entry, write_entry

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LAYER_INDEX = re.compile(r"(\d+)")


@dataclass(frozen=True)
class WorkerCounters:
    loaded_blocks: int
    load_errors: int
    loaded_bytes: int
    load_seconds: float
    saved_blocks: int
    saved_bytes: int
    save_seconds: float
    """Coding and writing, on the background thread."""
    dropped_saves: int
    evicted: int
    damaged_deleted: int
    """Entries deleted because they failed a load's checks."""


def _lower_priority() -> None:
    """Run the save thread (and the threads its kernels start, which inherit it) at the lowest
    CPU priority, so coding yields to the engine's forward on a busy CPU (Linux: per thread)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def layer_order(names: list[str]) -> list[str]:
    """Layer names in model order: by the last integer in each name.

    >>> layer_order(["model.layers.10.attn", "model.layers.2.attn"])
    ['model.layers.2.attn', 'model.layers.10.attn']
    """
    def index(name: str) -> int:
        found = _LAYER_INDEX.findall(name)
        if not found:
            raise ConnectorConfigError(f"cannot tell the layer index of KV cache {name!r}")
        return int(found[-1])

    return sorted(names, key=index)


class WorkerCore:
    """The worker side (see the module docstring)."""

    def __init__(self, model: WarmModel, config: EntryConfig, layout: PagedLayout,
                 tier: WarmTier, max_pending: int = 16) -> None:
        self.model = model
        self.layout = layout
        self.tier = tier
        self.codec = segment_codec(config, model.geometry, layout.block_size)
        self.config = config
        self.max_pending = max_pending
        self._caches: list[torch.Tensor] = []
        self._errors: set[int] = set()
        self._failed_requests: set[str] = set()
        self._queue = BackgroundQueue("seqkv-warm-save", initializer=_lower_priority)
        self._lock = threading.Lock()
        self._loaded = self._load_errors = self._loaded_bytes = 0
        self._load_seconds = 0.0
        self._saved = self._saved_bytes = self._dropped = self._damaged_deleted = 0
        self._save_seconds = 0.0
        # NOTE: keys copied out and queued, not yet written: a request that arrives while
        # another's saves of the same blocks run (the same prompt twice in a row) would code
        # them again, since the scheduler plans saves from what the tier holds. A key leaves
        # this set only after its entry is written, and ``save`` also skips keys the tier holds
        # by then: a save the scheduler planned before the write ended is not coded again.
        self._in_flight: set[bytes] = set()

    def register(self, caches: Mapping[str, torch.Tensor]) -> None:
        """``register_kv_caches``: the engine's per-layer paged tensors, in model order."""
        ordered = [caches[name] for name in layer_order(list(caches))]
        if len(ordered) != self.model.geometry.layers:
            raise ConnectorConfigError(
                f"the engine registered {len(ordered)} KV layers; the model has "
                f"{self.model.geometry.layers}: seqkv's connector supports one KV cache group "
                "of full attention (run vLLM with --disable-hybrid-kv-cache-manager)"
            )
        for cache in ordered:
            self.layout.check(cache)
            if cache.dtype not in SUPPORTED_DTYPES:
                raise ConnectorConfigError(
                    f"KV cache dtype {cache.dtype} is not supported by the warm tier; use "
                    "--kv-cache-dtype auto (float32, float16 or bfloat16)"
                )
            self._check_coding(cache.dtype)
        self._caches = ordered

    def _check_coding(self, dtype: torch.dtype) -> None:
        """Refuse a cache whose dtype is not the exact coding's (invariant 4): its saves would
        all fail on the background thread."""
        if isinstance(self.config, ExactConfig) and dtype != self.config.torch_dtype:
            raise ConnectorConfigError(
                f"the warm tier codes exact entries of {self.config.dtype}, and the engine's KV "
                f"cache is {dtype}: an exact entry is the cache's own bits, so the two must "
                "agree (the connector derives its coding from the model's dtype)"
            )

    @property
    def kv_dtype(self) -> torch.dtype:
        return self._caches[0].dtype

    def load(self, plan: StepPlan) -> int:
        """``start_load_kv``: decode and scatter every planned block; return blocks loaded."""
        if not plan.loads:
            return 0
        started = time.perf_counter()
        good_blocks: list[int] = []
        good_requests: list[str] = []
        good_keys: list[bytes] = []
        payloads: list[bytes] = []
        read = 0
        for order in plan.loads:
            for key, block in zip(order.keys, order.block_ids, strict=True):
                data = self.tier.read(key)
                if data is None:
                    self._fail(block, order.request_id)
                    continue
                read += len(data)
                try:
                    header, payload = read_entry(data, self.model, entry_tag(key))
                    if header.config != self.config or header.num_tokens != (
                            self.layout.block_size):
                        self._fail(block, order.request_id, key)
                        continue
                except SeqKVError:
                    self._fail(block, order.request_id, key)
                    continue
                good_blocks.append(block)
                good_requests.append(order.request_id)
                good_keys.append(key)
                payloads.append(payload)
        loaded = 0
        if payloads:
            try:
                kv = self.codec.decode(payloads)  # [n, L, 2, H, B, D]
                blocks = good_blocks
            except SeqKVError:
                kv, blocks = self._decode_each(good_blocks, good_requests, good_keys,
                                               payloads)
            if blocks:
                self.layout.scatter(self._caches, blocks, kv)
                loaded = len(blocks)
        self._loaded += loaded
        self._loaded_bytes += read
        self._load_seconds += time.perf_counter() - started
        return loaded

    def _decode_each(self, blocks: list[int], requests: list[str], keys: list[bytes],
                     payloads: list[bytes]) -> tuple[torch.Tensor, list[int]]:
        """Decode one by one, to isolate the entries a batch decode refused."""
        kept: list[torch.Tensor] = []
        kept_blocks: list[int] = []
        for block, request, key, payload in zip(blocks, requests, keys, payloads, strict=True):
            try:
                kept.append(self.codec.decode([payload]))
                kept_blocks.append(block)
            except SeqKVError:
                self._fail(block, request, key)
        if not kept:
            return torch.empty(0), []
        return torch.cat(kept), kept_blocks

    def _fail(self, block: int, request: str, damaged: bytes | None = None) -> None:
        """Report ``block``; delete the entry ``damaged`` (read, and failed a check)."""
        self._errors.add(block)
        self._failed_requests.add(request)
        self._load_errors += 1
        if damaged is not None:
            self.tier.delete(damaged)
            with self._lock:
                self._damaged_deleted += 1

    def take_load_errors(self) -> set[int]:
        """``get_block_ids_with_load_errors``: failed blocks since the last call."""
        errors, self._errors = self._errors, set()
        return errors

    def save(self, plan: StepPlan) -> None:
        """``wait_for_save``: copy the planned blocks out now; code and write them later."""
        # NOTE: a request whose load failed this step computed its new blocks over a block
        # that holds no valid KV; the engine recomputes them, and they are saved from that step.
        orders = [o for o in plan.saves if o.keys and o.request_id not in self._failed_requests]
        self._failed_requests = set()
        if not orders:
            return
        if self._queue.pending >= self.max_pending:
            with self._lock:
                self._dropped += sum(len(o.keys) for o in orders)
            return
        with self._lock:  # each key once, none whose save is under way, none written since
            chosen = dict(pair for o in orders for pair in zip(o.keys, o.block_ids, strict=True)
                          if pair[0] not in self._in_flight and not self.tier.contains(pair[0]))
            self._in_flight.update(chosen)
        if not chosen:
            return
        keys, blocks = list(chosen), list(chosen.values())
        protected = plan.protected
        try:
            copied = self.layout.gather(self._caches, blocks)  # [n, L, 2, H, B, D], engine dtype
            self._queue.submit(lambda: self._code_and_write(keys, copied, protected))
        except BaseException:
            # NOTE: only ``_code_and_write`` releases its keys; a save that never reaches it
            # releases them here, or those blocks would never be saved again.
            with self._lock:
                self._in_flight.difference_update(keys)
            raise

    def _code_and_write(self, keys: list[bytes], kv: torch.Tensor,
                        protected: frozenset[bytes]) -> None:
        started = time.perf_counter()
        try:
            payloads, _ = self.codec.encode(kv)  # the lossy codec computes in float32
            written = 0
            for key, payload in zip(keys, payloads, strict=True):
                header = EntryHeader(self.model.digest, entry_tag(key), self.config,
                                     self.model.geometry, self.layout.block_size)
                data = write_entry(header, payload)
                self.tier.write(key, data)
                written += len(data)
            self.tier.evict(protected)
            with self._lock:
                self._saved += len(keys)
                self._saved_bytes += written
                self._save_seconds += time.perf_counter() - started
        finally:
            with self._lock:
                self._in_flight.difference_update(keys)

    def drain(self) -> None:
        """Wait for every queued save (tests, benchmarks, shutdown)."""
        self._queue.drain()

    def shutdown(self) -> None:
        self._queue.shutdown()

    def counters(self) -> WorkerCounters:
        with self._lock:
            return WorkerCounters(self._loaded, self._load_errors, self._loaded_bytes,
                                  self._load_seconds, self._saved, self._saved_bytes,
                                  self._save_seconds, self._dropped, self.tier.evicted,
                                  self._damaged_deleted)

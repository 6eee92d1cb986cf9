"""The scheduler side of the connector: warm matches, pins, per-step load and save plans.

Motivation: vLLM's scheduler asks a connector how many of a request's tokens it can supply
(``get_num_new_matched_tokens``), tells it which blocks it allocated (``update_state_after_alloc``),
and once per step collects the metadata its workers act on (``build_connector_meta``). This
module holds that logic without importing vLLM: requests and scheduler outputs are read through
the Protocols below, which vLLM's ``Request`` and ``SchedulerOutput`` satisfy and which the test
driver (``tests/vllm_driver.py``) implements with plain objects.

What each call mutates:

- ``match`` (``get_num_new_matched_tokens``): only the request's pin, replaced, never
  accumulated: calling it again with the same arguments gives the same answer and the same state.
- ``allocated`` (``update_state_after_alloc``): the request's state; the pending load.
- ``plan`` (``build_connector_meta``): block tables, save progress, releases the pins of the
  loads it plans.
- ``finished`` (``request_finished``): drops the request, queues its tokens for the cold tier.

Invariants:
1. A match is block-aligned and leaves at least the prompt's last token to compute (vLLM needs
   one token to sample from), and counts only blocks whose entries exist now, in order from the
   first (enforced).
2. A request whose ``seqkv_warm`` is not ``true`` (when absent:
   ``ConnectorSettings.loads_by_default``, ``true`` in the exact mode, ``false`` in the lossy
   one) never matches: lossy loads are opt-in, exact ones opt-out (enforced).
3. Keys are rooted at the request's tenant; two tenants' equal prompts share no key (enforced by
   ``KeySpace``; checked by the driver).
4. A block is planned for saving once it is full and its KV computed
   (``num_computed_tokens + num_scheduled_tokens``), once per request, unless the engine
   truncated the request below it after a failed load; then again from the recomputing step
   (enforced).
5. A preempted request keeps its keys and save progress (its entries are content-addressed and
   already written) and forgets its block table, which vLLM sends again in full on resumption
   (enforced).
6. ``seqkv_warm_loaded_tokens`` counts the loaded tokens the engine kept: a load that failed
   from block k on counts only the blocks before k (0 when the first failed), read from the
   engine's ``num_computed_tokens`` at the request's next step (enforced; checked by the driver).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from seqkv.integrations.vllm.keys import KeySpace
from seqkv.integrations.vllm.plan import BlockOrder, StepPlan
from seqkv.integrations.vllm.settings import ConnectorSettings
from seqkv.integrations.vllm.warm_tier import WarmTier

_STORE_ID = re.compile(r"[A-Za-z0-9_:@-][A-Za-z0-9_.:@-]{0,127}")


class RequestView(Protocol):
    """What the connector reads of a request (vLLM's ``Request`` has all of it)."""

    @property
    def request_id(self) -> str: ...

    @property
    def all_token_ids(self) -> Sequence[int]: ...

    @property
    def cache_salt(self) -> str | None: ...

    @property
    def kv_transfer_params(self) -> Mapping[str, Any] | None: ...


class NewRequestView(Protocol):
    @property
    def req_id(self) -> str: ...

    @property
    def block_ids(self) -> tuple[list[int], ...]: ...

    @property
    def num_computed_tokens(self) -> int: ...


class CachedRequestsView(Protocol):
    @property
    def req_ids(self) -> list[str]: ...

    @property
    def resumed_req_ids(self) -> set[str]: ...

    @property
    def new_block_ids(self) -> list[tuple[list[int], ...] | None]: ...

    @property
    def num_computed_tokens(self) -> list[int]: ...


class SchedulerOutputView(Protocol):
    """What the connector reads of one step's scheduler output."""

    @property
    def scheduled_new_reqs(self) -> Sequence[NewRequestView]: ...

    @property
    def scheduled_cached_reqs(self) -> CachedRequestsView: ...

    @property
    def num_scheduled_tokens(self) -> Mapping[str, int]: ...

    @property
    def preempted_req_ids(self) -> Collection[str] | None: ...

    @property
    def finished_req_ids(self) -> Collection[str]: ...


def store_id(value: str, prefix: str) -> str:
    """``value`` if the session store accepts it as an id, else ``prefix`` + its digest.

    >>> store_id("tenant-a", "t-"), store_id("a b", "t-")
    ('tenant-a', 't-c8687a08aa5d6ed2')
    """
    if _STORE_ID.fullmatch(value):
        return value
    return prefix + hashlib.sha256(value.encode()).hexdigest()[:16]


@dataclass
class _Request:
    request: RequestView
    tenant: str
    warm: bool
    keys: list[bytes] = field(default_factory=list)
    """Keys of the request's full blocks, as far as they were needed."""
    block_ids: list[int] = field(default_factory=list)
    saved: int = 0
    """Blocks planned for saving (or found present) so far."""
    pending: tuple[int, int] | None = None
    """A warm load ``[first block, end block)`` to plan at the next step."""
    loaded_tokens: int = 0
    load_span: tuple[int, int] | None = None
    """The tokens ``[start, end)`` of the last planned load, until the engine reports how many
    of them it kept (its ``num_computed_tokens`` at the request's next step)."""
    saved_blocks: int = 0


@dataclass(frozen=True)
class SchedulerCounters:
    matches: int
    matched_tokens: int
    planned_loads: int
    planned_saves: int
    finished: int


@dataclass(frozen=True)
class FinishedRequest:
    """What ``finished`` returns: the response's transfer params, and the cold tier's work."""

    params: dict[str, int | str | bool]
    tokens: tuple[int, ...]
    tenant: str
    session: str


class SchedulerCore:
    """The scheduler side (see the module docstring)."""

    def __init__(self, settings: ConnectorSettings, space: KeySpace, tier: WarmTier) -> None:
        self.settings = settings
        self.space = space
        self.tier = tier
        self.block_size = space.block_size
        self._requests: dict[str, _Request] = {}
        self._pins: dict[str, tuple[int, tuple[bytes, ...]]] = {}
        """Per request: the engine's computed tokens at the match, and the keys matched."""
        self._matches = self._matched_tokens = self._loads = self._saves = self._finished = 0

    def tenant(self, request: RequestView) -> str:
        params = request.kv_transfer_params or {}
        tenant = params.get("seqkv_tenant")
        if isinstance(tenant, str) and tenant:
            return tenant
        return request.cache_salt or ""

    def wants_warm(self, request: RequestView) -> bool:
        params = request.kv_transfer_params or {}
        value = params.get("seqkv_warm", self.settings.loads_by_default)
        return value is True

    def match(self, request: RequestView, num_computed_tokens: int) -> int:
        """``get_num_new_matched_tokens``: warm tokens beyond ``num_computed_tokens``."""
        request_id = request.request_id
        if not self.wants_warm(request):
            self._pins.pop(request_id, None)
            return 0
        tokens = request.all_token_ids
        usable = (len(tokens) - 1) // self.block_size * self.block_size
        keys = self.space.block_keys(tokens[:usable], self.tenant(request))
        hits = 0
        while hits < len(keys) and self.tier.contains(keys[hits]):
            hits += 1
        matched = hits * self.block_size
        if matched <= num_computed_tokens:
            self._pins.pop(request_id, None)
            return 0
        self._pins[request_id] = (num_computed_tokens, tuple(keys[:hits]))
        return matched - num_computed_tokens

    def allocated(self, request: RequestView, num_external_tokens: int) -> None:
        """``update_state_after_alloc``."""
        request_id = request.request_id
        state = self._requests.get(request_id)
        if state is None:
            state = _Request(request, self.tenant(request), self.wants_warm(request))
            self._requests[request_id] = state
        computed, pinned = self._pins.get(request_id, (0, ()))
        first = computed // self.block_size
        end = first + num_external_tokens // self.block_size
        if num_external_tokens <= 0 or end > len(pinned):
            self._pins.pop(request_id, None)
            state.pending = None
            return
        # NOTE: the blocks after the engine's own computed ones, as many as it accepted (it may
        # accept fewer than were matched).
        state.pending = (first, end)
        state.loaded_tokens += num_external_tokens
        self._matches += 1
        self._matched_tokens += num_external_tokens

    def _keys_upto(self, state: _Request, count: int) -> list[bytes]:
        if len(state.keys) < count:
            tokens = state.request.all_token_ids[: count * self.block_size]
            parent = state.keys[-1] if state.keys else None
            state.keys += self.space.block_keys(tokens, state.tenant, start=len(state.keys),
                                                parent=parent)
        return state.keys[:count]

    def _plan_load(self, state: _Request, loads: list[BlockOrder]) -> None:
        if state.pending is None:
            return
        first, end = state.pending
        state.pending = None
        keys = self._keys_upto(state, end)
        state.load_span = (first * self.block_size, end * self.block_size)
        self._pins.pop(state.request.request_id, None)
        loads.append(BlockOrder(state.request.request_id, tuple(keys[first:end]),
                               tuple(state.block_ids[first:end])))
        self._loads += 1

    def _plan_save(self, state: _Request, computed: int, saves: list[BlockOrder]) -> None:
        if not self.settings.warm_save:
            return
        full = min(computed, len(state.request.all_token_ids)) // self.block_size
        full = min(full, len(state.block_ids))
        if full <= state.saved:
            return
        keys = self._keys_upto(state, full)
        chosen = [(keys[i], state.block_ids[i]) for i in range(state.saved, full)
                  if not self.tier.contains(keys[i])]
        state.saved = full
        if chosen:
            saves.append(BlockOrder(state.request.request_id, tuple(k for k, _ in chosen),
                                   tuple(b for _, b in chosen)))
            state.saved_blocks += len(chosen)
            self._saves += len(chosen)

    def plan(self, output: SchedulerOutputView) -> StepPlan:
        """``build_connector_meta``: this step's loads, saves and protected keys."""
        protected = self.pinned
        for request_id in output.preempted_req_ids or ():
            state = self._requests.get(request_id)
            if state is not None:
                state.block_ids = []
                state.pending = None
        loads: list[BlockOrder] = []
        saves: list[BlockOrder] = []
        scheduled = output.num_scheduled_tokens
        for new in output.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is None:
                continue
            state.block_ids = list(new.block_ids[0])
            self._plan_load(state, loads)
            self._plan_save(state, new.num_computed_tokens + scheduled.get(new.req_id, 0),
                            saves)
        cached = output.scheduled_cached_reqs
        for index, request_id in enumerate(cached.req_ids):
            state = self._requests.get(request_id)
            if state is None:
                continue
            new_blocks = cached.new_block_ids[index]
            if request_id in cached.resumed_req_ids:
                state.block_ids = [] if new_blocks is None else list(new_blocks[0])
            elif new_blocks is not None:
                state.block_ids += new_blocks[0]
            done = cached.num_computed_tokens[index]
            if state.load_span is not None:
                # NOTE: a failed load truncates the request to its first failed block: what the
                # engine kept of the load is what the response reports (invariant 6).
                start, end = state.load_span
                state.loaded_tokens -= end - min(end, max(start, done))
                state.load_span = None
            self._plan_load(state, loads)
            if done < state.saved * self.block_size:
                # The engine truncated the request (a failed load): blocks past ``done`` are
                # recomputed in this step and saved from it, not from the failed step.
                state.saved = done // self.block_size
            self._plan_save(state, done + scheduled.get(request_id, 0), saves)
        for request_id in output.finished_req_ids:
            self._requests.pop(request_id, None)
            self._pins.pop(request_id, None)
        return StepPlan(tuple(loads), tuple(saves), protected)

    def finished(self, request: RequestView) -> FinishedRequest:
        """``request_finished``: the response's ``kv_transfer_params`` and the cold put."""
        request_id = request.request_id
        state = self._requests.pop(request_id, None)
        self._pins.pop(request_id, None)
        self._finished += 1
        params = request.kv_transfer_params or {}
        session = params.get("seqkv_session")
        session_id = store_id(session if isinstance(session, str) else request_id, "s-")
        tenant = self.tenant(request)
        result: dict[str, int | str | bool] = {
            "seqkv_warm_loaded_tokens": 0 if state is None else state.loaded_tokens,
            "seqkv_warm_lossy": (self.settings.warm_mode == "lossy" and state is not None
                                 and state.loaded_tokens > 0),
            "seqkv_warm_saved_blocks": 0 if state is None else state.saved_blocks,
        }
        if self.settings.cold_store is not None:
            # NOTE: the session's id and status are the cold tier's ticket's (ColdTicket.params)
            result["seqkv_cold_namespace"] = store_id(tenant or "default", "t-")
        return FinishedRequest(result, tuple(int(t) for t in request.all_token_ids),
                               store_id(tenant or "default", "t-"), session_id)

    @property
    def pinned(self) -> frozenset[bytes]:
        return frozenset(k for _, keys in self._pins.values() for k in keys)

    def counters(self) -> SchedulerCounters:
        return SchedulerCounters(self._matches, self._matched_tokens, self._loads, self._saves,
                                 self._finished)

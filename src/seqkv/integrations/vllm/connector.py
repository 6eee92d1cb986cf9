"""``SeqKVConnector``: the vLLM ``KVConnectorBase_V1`` adapter over seqkv's connector logic.

This is the only seqkv module that imports vLLM; vLLM loads it by
``kv_connector_module_path = "seqkv.integrations.vllm.connector"``. Each method hands its
arguments to the scheduler-side (:class:`~seqkv.integrations.vllm.scheduler.SchedulerCore`) or
worker-side (:class:`~seqkv.integrations.vllm.worker.WorkerCore`) logic, which run without vLLM
and are what the CI driver tests.

Deviations from a layer-by-layer connector: ``save_kv_layer`` and ``wait_for_layer_load`` do
nothing. Loads are whole-step (decoded once, scattered into every layer before the forward:
decoding is one batched call of the warm codec, not worth pipelining by layer on a CPU), and
saves copy all layers' new blocks at ``wait_for_save``, after the forward, then code them on a
background thread.

Invariants:
1. Tensor and pipeline parallelism above 1 are refused by name at construction (enforced:
   ``ConnectorConfigError``), until a rank's share of the heads is keyed and tested.
2. The keys hash the model folder's digest (or ``model_digest``), the KV dtype, the block size,
   the layout and the warm config (enforced: ``KeySpace``).
3. With ``SEQKV_VLLM_TRACE`` set, every call is appended to that file (``trace.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from seqkv import environment
from seqkv.digests import Digest
from seqkv.errors import ConnectorConfigError
from seqkv.integrations.vllm.cold import ColdTier
from seqkv.integrations.vllm.counters import CounterLog
from seqkv.integrations.vllm.keys import KeySpace, folder_digest
from seqkv.integrations.vllm.paged import LayoutName, PagedLayout
from seqkv.integrations.vllm.plan import StepPlan
from seqkv.integrations.vllm.scheduler import SchedulerCore
from seqkv.integrations.vllm.settings import ConnectorSettings, check_parallelism
from seqkv.integrations.vllm.trace import TRACE_ENV, TraceWriter
from seqkv.integrations.vllm.warm_tier import WarmTier
from seqkv.integrations.vllm.worker import WorkerCore
from seqkv.types import KVGeometry
from seqkv.warm import WarmModel

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request


class SeqKVMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's plan, from the scheduler to the workers."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


class SeqKVConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """seqkv's warm (exact or lossy, no forward) and cold (exact) tiers behind vLLM's connector
    API."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        _log_through_vllm()
        parallel = vllm_config.parallel_config
        check_parallelism(parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.settings = ConnectorSettings.parse(extra)
        model_config = vllm_config.model_config
        geometry = KVGeometry(model_config.get_num_layers(parallel),
                              model_config.get_total_num_kv_heads(), model_config.get_head_size())
        digest = (bytes.fromhex(self.settings.model_digest) if self.settings.model_digest
                  else folder_digest(model_config.model))
        cache_config = vllm_config.cache_config
        if cache_config.cache_dtype not in ("auto", None):
            raise ConnectorConfigError(
                f"KV cache dtype {cache_config.cache_dtype!r} is not supported by the warm tier: "
                "use --kv-cache-dtype auto"
            )
        kv_dtype = _dtype_name(model_config.dtype)
        block_size = int(cache_config.block_size)
        layout: LayoutName = "cpu" if vllm_config.device_config.device_type == "cpu" else "nhd"
        coding = self.settings.coding(model_config.dtype)
        space = KeySpace(digest, kv_dtype, block_size, layout, coding.config_bytes())
        tier = WarmTier(self.settings.warm_dir, self.settings.warm_budget_bytes)
        trace = environment.path(TRACE_ENV, "file")
        self._trace = None if trace is None else TraceWriter(
            trace, "scheduler" if role == KVConnectorRole.SCHEDULER else "worker")
        self._scheduler: SchedulerCore | None = None
        self._worker: WorkerCore | None = None
        self._cold: ColdTier | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerCore(self.settings, space, tier)
            if self.settings.cold_store is not None:
                self._cold = _open_cold(self.settings.cold_store, str(model_config.model),
                                        self.settings.cold_queue)
            self._counters = CounterLog("scheduler", self._scheduler_counters,
                                        self.settings.counters_log_seconds)
        else:
            self._worker = WorkerCore(WarmModel(Digest(digest), geometry), coding,
                                      PagedLayout(layout, geometry, block_size), tier,
                                      max_pending=self.settings.warm_queue)
            worker = self._worker
            self._counters = CounterLog("worker", lambda: (worker.counters(),),
                                        self.settings.counters_log_seconds)

    def _scheduler_counters(self) -> tuple[object, ...]:
        assert self._scheduler is not None
        cold = () if self._cold is None else (self._cold.counters(),)
        return (self._scheduler.counters(), *cold)

    # Worker side.

    def _plan(self) -> StepPlan:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, SeqKVMetadata)
        return metadata.plan

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register(kv_caches)
        if self._worker.layout.name == "cpu":
            check_cpu_layout(self._worker.layout, self._worker.kv_dtype)
        if self._trace:
            self._trace.write("register_kv_caches", layers=len(kv_caches),
                              shape=list(next(iter(kv_caches.values())).shape))

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self._worker is not None
        plan = self._plan()
        loaded = self._worker.load(plan)
        if self._trace and plan.loads:
            self._trace.write("start_load_kv", loaded=loaded,
                              blocks=[list(o.block_ids) for o in plan.loads])

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        assert self._worker is not None
        plan = self._plan()
        self._worker.save(plan)
        self._counters.tick()
        if self._trace and plan.saves:
            self._trace.write("wait_for_save", blocks=[list(o.block_ids) for o in plan.saves])

    def get_block_ids_with_load_errors(self) -> set[int]:
        assert self._worker is not None
        errors = self._worker.take_load_errors()
        if self._trace and errors:
            self._trace.write("get_block_ids_with_load_errors", blocks=sorted(errors))
        return errors

    def shutdown(self) -> None:
        # NOTE: vLLM waits --shutdown-timeout seconds (workers: VLLM_WORKER_SHUTDOWN_TIMEOUT_
        # SECONDS) for this, then kills the process: scripts/vllm.sh serve sets both.
        queues = [q.shutdown for q in (self._worker, self._cold) if q is not None]
        self._counters.close(*queues)

    # Scheduler side.

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        assert self._scheduler is not None
        matched = self._scheduler.match(request, num_computed_tokens)
        if self._trace:
            self._trace.write("get_num_new_matched_tokens", request=request.request_id,
                              tokens=[int(t) for t in request.all_token_ids],
                              salt=request.cache_salt,
                              warm=self._scheduler.wants_warm(request),
                              num_computed=num_computed_tokens, result=matched)
        return matched, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.allocated(request, num_external_tokens)
        if self._trace:
            self._trace.write("update_state_after_alloc", request=request.request_id,
                              num_external=num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> SeqKVMetadata:
        assert self._scheduler is not None
        plan = self._scheduler.plan(scheduler_output)
        self._counters.tick()
        if self._trace:
            new = scheduler_output.scheduled_new_reqs
            cached = scheduler_output.scheduled_cached_reqs
            scheduled = scheduler_output.num_scheduled_tokens
            self._trace.write(
                "build_connector_meta",
                new=[[r.req_id, list(r.block_ids[0]), r.num_computed_tokens,
                      scheduled.get(r.req_id, 0)] for r in new],
                cached=[[rid, rid in cached.resumed_req_ids,
                         None if b is None else list(b[0]), n, scheduled.get(rid, 0)]
                        for rid, b, n in zip(cached.req_ids, cached.new_block_ids,
                                             cached.num_computed_tokens, strict=True)],
                preempted=sorted(scheduler_output.preempted_req_ids or ()),
                finished=sorted(scheduler_output.finished_req_ids),
                loads=[[o.request_id, list(o.block_ids)] for o in plan.loads],
                saves=[[o.request_id, list(o.block_ids)] for o in plan.saves])
        return SeqKVMetadata(plan)

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        finished = self._scheduler.finished(request)
        params: dict[str, Any] = dict(finished.params)
        if self._cold is not None:
            params |= self._cold.put(finished.session, finished.tokens, finished.tenant).params()
        if self._trace:
            self._trace.write("request_finished", request=request.request_id,
                              tokens=list(finished.tokens), params=params)
        return False, params

    @property
    def requires_kv_delivery(self) -> bool:
        return False


def _log_through_vllm() -> None:
    """seqkv's loggers write through vLLM's handlers, at INFO: vLLM configures only its own
    logger, so the connector's lines (the counters, each cause of a failed cold put, damaged
    entries) were otherwise dropped in every engine process. Left alone where the application
    configured seqkv's logging itself."""
    ours, theirs = logging.getLogger("seqkv"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False


def write_probe_block(dtype: torch.dtype, kv_heads: int, head_dim: int, block_size: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """Keys and values ``[block_size, kv_heads, head_dim]`` (seeded), and the one-block CPU cache
    ``[1, kv_heads, block_size, 2 * head_dim]`` that vLLM's own ``cpu_attn_reshape_and_cache``
    makes of them, with the kernel ISA it used."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    generator = torch.Generator().manual_seed(0)
    key = torch.randn(block_size, kv_heads, head_dim, generator=generator).to(dtype)
    value = torch.randn(block_size, kv_heads, head_dim, generator=generator).to(dtype)
    cache = torch.zeros(1, kv_heads, block_size, 2 * head_dim, dtype=dtype)
    key_cache, value_cache = cache.view(1, kv_heads, 2 * block_size, head_dim).chunk(2, dim=2)
    isa = str(_get_attn_isa(dtype, block_size, head_dim))
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache,
                                   torch.arange(block_size), isa)
    return key, value, cache, isa


def check_cpu_layout(layout: PagedLayout, dtype: torch.dtype) -> None:
    """Refuse to start unless ``layout`` reads back what this vLLM's CPU kernel writes."""
    g = layout.geometry
    key, value, cache, isa = write_probe_block(dtype, g.kv_heads, g.head_dim, layout.block_size)
    single = PagedLayout(layout.name, KVGeometry(1, g.kv_heads, g.head_dim), layout.block_size)
    read = single.gather([cache], [0])[0, 0]  # [2, H, B, D]
    if not (torch.equal(read[0], key.transpose(0, 1)) and torch.equal(read[1],
                                                                     value.transpose(0, 1))):
        raise ConnectorConfigError(
            f"vLLM's CPU attention kernels ({isa!r}) lay the paged KV out differently from the "
            "layout seqkv's connector knows (keys [head_dim, block_size] then values "
            "[block_size, head_dim] per block and head): this vLLM version is not supported"
        )


def _open_cold(url: str, model_path: str, max_pending: int) -> ColdTier:
    """The cold tier's store, with seqkv's own copy of the model (the store codes tokens under
    it; the engine's weights are not reachable from the scheduler process)."""
    from seqkv.models import load_model
    from seqkv.store import SessionStore

    model = load_model(model_path)
    store = (SessionStore.directory(url.removeprefix("dir:"), model) if url.startswith("dir:")
             else SessionStore.redis(url, model))
    return ColdTier(store, max_pending=max_pending)

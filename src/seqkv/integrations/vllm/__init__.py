"""seqkv as a vLLM KV connector: a warm tier that loads without a forward, a cold tier that keeps
sessions exactly.

Load it in vLLM (the class lives in ``seqkv.integrations.vllm.connector``, the one module that
imports vLLM)::

    vllm serve ./smollm2-hf --block-size 32 --disable-hybrid-kv-cache-manager \\
      --no-enable-prefix-caching --kv-transfer-config '{
        "kv_connector": "SeqKVConnector",
        "kv_connector_module_path": "seqkv.integrations.vllm.connector",
        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"warm_dir": "/var/cache/seqkv", "warm_bits": 3,
                                      "cold_store": "dir:/var/lib/seqkv"}}'

Everything else here runs without vLLM: the settings, the keys, the warm tier's folder, the paged
gather/scatter, and the scheduler-side and worker-side logic, which the CI driver
(``tests/vllm_driver.py``) calls in vLLM's order over transformers.

- :mod:`.settings`: ``kv_connector_extra_config`` parsed and checked.
- :mod:`.keys`: seqkv's prefix hashes (restart-stable, per tenant, per model and layout).
- :mod:`.warm_tier`: the warm entries' folder, budget and LRU eviction.
- :mod:`.paged`: blocks between a paged cache and ``[blocks, L, 2, H, B, D]``.
- :mod:`.plan`: the per-step metadata.
- :mod:`.scheduler`, :mod:`.worker`: the two sides.
- :mod:`.cold`: the exact session store, fed at ``request_finished``.
- :mod:`.connector`: ``SeqKVConnector(KVConnectorBase_V1)``, the adapter (imports vLLM).
"""

from __future__ import annotations

from seqkv.integrations.vllm.cold import ColdCounters, ColdTier
from seqkv.integrations.vllm.keys import KeySpace, entry_tag, folder_digest
from seqkv.integrations.vllm.paged import LAYOUTS, LayoutName, PagedLayout
from seqkv.integrations.vllm.plan import BlockOrder, StepPlan
from seqkv.integrations.vllm.scheduler import (
    FinishedRequest,
    RequestView,
    SchedulerCore,
    SchedulerCounters,
    SchedulerOutputView,
)
from seqkv.integrations.vllm.settings import ConnectorSettings
from seqkv.integrations.vllm.warm_tier import WarmTier
from seqkv.integrations.vllm.worker import WorkerCore, WorkerCounters

__all__ = [
    "LAYOUTS",
    "BlockOrder",
    "ColdCounters",
    "ColdTier",
    "ConnectorSettings",
    "FinishedRequest",
    "KeySpace",
    "LayoutName",
    "PagedLayout",
    "RequestView",
    "SchedulerCore",
    "SchedulerCounters",
    "SchedulerOutputView",
    "StepPlan",
    "WarmTier",
    "WorkerCore",
    "WorkerCounters",
    "entry_tag",
    "folder_digest",
]

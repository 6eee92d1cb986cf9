"""Smoke run of SeqKVConnector inside vLLM's CPU build (run with scripts/vllm.sh python)."""

from __future__ import annotations

import json
import sys
import time

from vllm import LLM, SamplingParams
from vllm.config import KVTransferConfig


def main() -> None:
    folder, warm_dir = sys.argv[1], sys.argv[2]
    quantizer, bits = ("turboquant_mse", 3)
    if len(sys.argv) > 4:
        quantizer, bits = sys.argv[3], int(sys.argv[4])
    config = KVTransferConfig(
        kv_connector="SeqKVConnector",
        kv_connector_module_path="seqkv.integrations.vllm.connector",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"warm_dir": warm_dir, "warm_bits": bits,
                                   "warm_quantizer": quantizer},
    )
    llm = LLM(model=folder, dtype="bfloat16", block_size=32, max_model_len=8192,
              enable_prefix_caching=False, kv_transfer_config=config,
              disable_hybrid_kv_cache_manager=True, enforce_eager=True,
              max_num_batched_tokens=8192, seed=0, gpu_memory_utilization=0.25)
    prompt = "The lighthouse on the northern cape was built in 1874. " * 12
    for attempt in range(2):
        params = SamplingParams(max_tokens=16, temperature=0.0,
                                extra_args={"kv_transfer_params": {"seqkv_warm": True}})
        started = time.perf_counter()
        out = llm.generate([prompt], params)
        print(json.dumps({"attempt": attempt, "seconds": time.perf_counter() - started,
                          "text": out[0].outputs[0].text,
                          "kv_transfer_params": out[0].kv_transfer_params}), flush=True)


if __name__ == "__main__":
    main()

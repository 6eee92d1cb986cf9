"""Record the connector calls vLLM makes, for ``tests/test_vllm_trace.py`` to replay in CI.

    scripts/vllm.sh python benchmarks/vllm_trace.py build/smollm2-hf tests/data/vllm_trace.jsonl

A small, deliberately cramped engine (16 KV blocks of 32 tokens) serves: two tenants sending the
same prompt, then a batch of three long requests that cannot all fit (vLLM preempts one and
resumes it), then a warm resume of a finished request. Every connector call is appended to the
trace (``SEQKV_VLLM_TRACE``), with the token ids the scheduler saw.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_prompts import token_prompt


def main() -> None:
    folder, trace = sys.argv[1], Path(sys.argv[2])
    trace.unlink(missing_ok=True)
    os.environ["SEQKV_VLLM_TRACE"] = str(trace.resolve())
    warm_dir = Path("/tmp/seqkv-trace-warm")
    shutil.rmtree(warm_dir, ignore_errors=True)
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    tokenizer = AutoTokenizer.from_pretrained(folder)

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer(text, add_special_tokens=False).input_ids
        return ids

    config = KVTransferConfig(
        kv_connector="SeqKVConnector",
        kv_connector_module_path="seqkv.integrations.vllm.connector",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"warm_dir": str(warm_dir), "warm_bits": 3})
    llm = LLM(model=folder, dtype="bfloat16", block_size=32, max_model_len=448,
              enable_prefix_caching=False, kv_transfer_config=config,
              disable_hybrid_kv_cache_manager=True, enforce_eager=True,
              num_gpu_blocks_override=16, max_num_seqs=3, max_num_batched_tokens=448,
              seed=0, gpu_memory_utilization=0.25)

    def params(n: int, **transfer: object) -> SamplingParams:
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True,
                              extra_args={"kv_transfer_params": transfer} if transfer else None)

    shared = token_prompt(encode, 100, seed=5)
    outputs = {}
    outputs["tenant-a"] = llm.generate([{"prompt_token_ids": shared, "cache_salt": "tenant-a"}],
                                       params(8), use_tqdm=False)
    outputs["tenant-b"] = llm.generate([{"prompt_token_ids": shared, "cache_salt": "tenant-b"}],
                                       params(8, seqkv_warm=True), use_tqdm=False)
    outputs["tenant-a again"] = llm.generate(
        [{"prompt_token_ids": shared, "cache_salt": "tenant-a"}], params(8, seqkv_warm=True),
        use_tqdm=False)
    long = [{"prompt_token_ids": token_prompt(encode, 150, seed=10 + i)} for i in range(3)]
    outputs["crowded"] = llm.generate(long, params(90, seqkv_warm=True), use_tqdm=False)
    outputs["resume"] = llm.generate([long[0]], params(4, seqkv_warm=True), use_tqdm=False)
    for name, result in outputs.items():
        print(json.dumps({name: [o.kv_transfer_params for o in result]}))


if __name__ == "__main__":
    main()

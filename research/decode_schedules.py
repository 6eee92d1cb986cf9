"""Decoding schedules on the embedded model: which are exact, what they cost (issue 5 groundwork).

Measures, on SmolLM2-135M, CPU, one intra-op thread:
(a) chunk-boundary invariance and later-token independence of the logit rows,
(b) batch invariance of a session's step rows (equal lengths, and left padding with a mask),
(c) forward seconds per chunk length and per batch size, against the weight-traffic floor,
and runs the two speculative prototypes (``research.decoding.speculative``, replayed by the encoder;
``research.decoding.blocked``, verified against a blocked prefill) next to the plain codec on prose
and on code. Every prototype run is decoded and compared with its input; the script stops
before writing the report if one is not exact.

Usage: ``.venv/bin/python benchmarks/decode_schedules.py [--tokens 128] [--quick]
[-o reports/decode_schedules.md]``. Takes about 13 minutes on 2 shared cores. It runs with
OPENBLAS_NUM_THREADS=1 (it re-executes itself to set it; see the note at the bottom).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from research.decoding import (
    DraftPolicy,
    Fallback,
    JacobiDraft,
    NoDraft,
    PromptLookup,
    blocked_decode,
    blocked_encode,
    probes,
    speculative_decode,
    speculative_encode,
)
from research.decoding.forward import LogitRows
from research.decoding.plan import plan_blocks, table_cost
from seqkv import compress, decompress
from seqkv.models import CausalLM, load_default_model
from seqkv.provenance import headed, start_run

# About 130 tokens of ordinary Python: the code-like text (repeated identifiers and idioms).
CODE_SAMPLE = '''def parse_config(lines):
    config = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        config[key.strip()] = value.strip()
    return config


def load_config(path):
    with open(path) as handle:
        return parse_config(handle.readlines())


class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key):
        self.counts[key] = self.counts.get(key, 0) + 1

    def get(self, key):
        return self.counts.get(key, 0)

    def most_common(self):
        return sorted(self.counts.items(), key=lambda item: item[1], reverse=True)
'''

CHUNKS = (1, 2, 4, 8, 16, 32)
PLAN_LENGTHS = (1, 4, 8, 16, 32)  # NOTE: 2 and 3 cost more than 4 on this CPU (see (c))
SHIFT = 3  # the shifted schedules start with a chunk of 3, then continue in their size


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; floats as given (format them before)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _diff(value: float) -> str:
    return "0" if value == 0 else f"{value:.1e}"


# (a) chunk boundaries ----------------------------------------------------------------------


def chunk_section(model: CausalLM, name: str, tokens: list[int], quick: bool
                  ) -> tuple[str, dict[str, bool]]:
    count = len(tokens)
    sizes = CHUNKS[:4] if quick else CHUNKS
    schedules: dict[str, list[int]] = {"token-by-token": [1] * count}
    for size in sizes[1:]:
        schedules[f"chunks of {size}"] = probes.chunk_sizes(count, size)
        schedules[f"chunks of {size}, shifted"] = probes.chunk_sizes(count, size, first=SHIFT)
    schedules["one prefill"] = [count]
    rows: dict[str, LogitRows] = {}
    for label, plan in schedules.items():
        rows[label] = probes.schedule_rows(model, tokens, plan)
        print(f"  {name}: {label}", flush=True)
    reference = rows["token-by-token"]
    anchor = "chunks of 16" if "chunks of 16" in rows else f"chunks of {sizes[-1]}"
    body = []
    exact: dict[str, bool] = {}
    for label, values in rows.items():
        vs_tbt = probes.compare_rows(label, values, reference)
        vs_anchor = probes.compare_rows(label, values, rows[anchor])
        vs_prefill = probes.compare_rows(label, values, rows["one prefill"])
        unshifted = label.removesuffix(", shifted")
        vs_unshifted = (f"{probes.compare_rows(label, values, rows[unshifted]).identical}/{count}"
                        if unshifted != label else "")
        exact[label] = vs_tbt.bit_identical
        exact[f"rows {label} = prefill"] = vs_prefill.bit_identical
        body.append([label, f"{vs_tbt.identical}/{count}", _diff(vs_tbt.max_abs_diff),
                     f"{vs_anchor.identical}/{count}", f"{vs_prefill.identical}/{count}",
                     vs_unshifted])
    prefill_kv = probes.schedule_kv(model, tokens, [count])
    kv_rows = []
    for label in ("token-by-token", "chunks of 16", "chunks of 16, shifted", "chunks of 32"):
        if label in schedules:
            same = bool(probes.schedule_kv(model, tokens, schedules[label]).equal(prefill_kv))
            exact[f"KV {label} = prefill"] = same
            kv_rows.append([label, "yes" if same else "no"])
    later = []
    for size in sizes[1:]:
        result = probes.later_token_independence(model, tokens, size, seed=size)
        exact[f"later tokens, chunks of {size}"] = result.bit_identical
        later.append([size, result.chunks, f"{result.identical_rows}/{result.rows}",
                      f"{result.identical_kv_chunks}/{result.chunks}",
                      _diff(result.max_abs_diff)])
    text = (
        f"**{name}** ({count} positions; row i is the logit row after token i; 'shifted' starts "
        f"with a chunk of {SHIFT}, then continues in the stated size):\n\n"
        + table(["schedule", "identical to token-by-token", "max abs diff vs token-by-token",
                 f"identical to {anchor}", "identical to one prefill",
                 "identical to the same size unshifted"], body)
        + f"\n\nKV cache ({name}, all layers) bit-identical to one prefill's:\n\n"
        + table(["schedule", "KV identical to one prefill"], kv_rows)
        + f"\n\nLater-token independence ({name}): each aligned chunk forwarded twice on the same "
        "cache, the second time with random tokens after a random cut; rows and KV at or "
        "before the cut compared.\n\n"
        + table(["chunk", "chunks", "identical rows", "identical KV (chunks)", "max abs diff"],
                later)
    )
    return text, exact


def _ranges(values: Sequence[int]) -> str:
    """``1, 2, 3, 5`` as ``1-3, 5``."""
    parts: list[list[int]] = []
    for value in values:
        if parts and value == parts[-1][-1] + 1:
            parts[-1].append(value)
        else:
            parts.append([value])
    return ", ".join(f"{p[0]}-{p[-1]}" if len(p) > 1 else f"{p[0]}" for p in parts) or "none"


def linear_section(model: CausalLM) -> str:
    results = probes.linear_row_invariance(model, max_rows=32)
    body = [[f"{r.out_features} x {r.in_features}", _ranges(r.identical_row_counts)]
            for r in results]
    return (
        "Where the differences come from: each distinct linear-layer weight of the model, "
        "`x[:M] @ W.T` against the first M rows of a 64-row product (random x, the model's "
        "own W). Rows computed in a matmul of M rows are bit-identical to the large product "
        "for these M (1 to 32):\n\n"
        + table(["weight (out x in)", "M with identical rows"], body)
    )


# (b) batches -------------------------------------------------------------------------------


def batch_section(model: CausalLM, sessions: list[list[int]], quick: bool
                  ) -> tuple[str, list[probes.RowComparison], list[int]]:
    sizes = [1, 2, 4] if quick else [1, 2, 4, 8, 16]
    results = probes.batch_invariance(model, sessions[: max(sizes)], sizes, paddings=(2, 6))
    body = [[r.case, f"{r.identical}/{r.rows}", _diff(r.max_abs_diff)] for r in results]
    text = (
        f"{max(sizes)} sessions of {len(sessions[0])} tokens (windows of the prose text), every "
        "position stepped token by token for all sessions at once; the rows of session 0 "
        "compared. Padded: session 0 cut short and left-padded by 2 or 6 positions (pad "
        "token, attention mask, position ids from its first real token).\n\n"
        + table(["case", "identical rows", "max abs diff"], body)
    )
    return text, results, sizes


# (c) timing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Costs:
    chunk: list[probes.Timing]
    batch: list[probes.Timing]
    weight_bytes: int
    bandwidth: float

    def chunk_seconds(self, size: int) -> float:
        """Measured seconds of a chunk of ``size``; linear between measured sizes (--quick)."""
        measured = {t.size: t.seconds for t in self.chunk}
        if size in measured:
            return measured[size]
        below = max(s for s in measured if s < size)
        above = min(s for s in measured if s > size)
        share = (size - below) / (above - below)
        return (1 - share) * measured[below] + share * measured[above]

    def batch_seconds(self, size: int) -> float:
        return next(t.seconds for t in self.batch if t.size == size)


def timing_section(model: CausalLM, context: list[int], quick: bool) -> tuple[str, Costs]:
    repeats = 3 if quick else 5
    lengths = [1, 2, 3, 4, 8, 16, 32] if quick else list(range(1, 33))
    batches = [1, 2, 4, 8] if quick else list(range(1, 17))
    costs = Costs(probes.chunk_timings(model, context, lengths, repeats),
                  probes.batch_timings(model, context, batches, repeats),
                  probes.weight_bytes(model), probes.read_bandwidth())
    single = costs.chunk_seconds(1)
    chunk_rows = [[t.size, f"{1e3 * t.seconds:.1f}", f"{1e3 * t.seconds_per_token:.1f}",
                   f"{t.seconds / single:.2f}", f"{t.size / t.seconds:.0f}"] for t in costs.chunk]
    batch_rows = [[t.size, f"{1e3 * t.seconds:.1f}", f"{t.seconds / costs.batch_seconds(1):.2f}",
                   f"{t.size / t.seconds:.0f}"] for t in costs.batch]
    floor = costs.weight_bytes / costs.bandwidth
    text = (
        f"Median of {repeats} forwards on a cache of {len(context)} positions, after one "
        "warm-up per shape.\n\n"
        "Chunk length (batch 1): the cost of verifying a speculative chunk.\n\n"
        + table(["chunk length", "ms / forward", "ms / position", "x one position",
                 "positions / s"], chunk_rows)
        + "\n\nBatch size (one position per session): the cost of stepping sessions together.\n\n"
        + table(["batch", "ms / forward", "x batch 1", "aggregate tokens / s"], batch_rows)
        + f"\n\nWeight traffic: the model's parameters are {costs.weight_bytes / 1e6:.0f} MB "
        f"(float32, tied embedding once); one thread reads {costs.bandwidth / 1e9:.1f} GB/s "
        f"(sum over 256 MB), so streaming the weights once costs {1e3 * floor:.0f} ms: "
        f"{floor / single:.0%} of a one-position forward ({1e3 * single:.0f} ms)."
    )
    return text, costs


# prototypes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    text: str
    schedule: str
    policy: str
    forwards: int
    tokens: int
    acceptance: float
    encode_seconds: float
    decode_seconds: float
    code_bits: int
    cross_entropy_bits: float
    lengths: tuple[int, ...]  # positions of each forward (the start token's excluded)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds

    def modelled_seconds(self, costs: Costs) -> float:
        """Decode time under the cost curve of (c): immune to load changes during the run."""
        return sum(costs.chunk_seconds(length) for length in self.lengths)


def _exact(decoded: list[int], tokens: list[int], label: str) -> None:
    if decoded != tokens:
        sys.exit(f"NOT EXACT: {label} decoded other tokens; no report written")


def codec_run(model: CausalLM, name: str, tokens: list[int]) -> tuple[Run, bytes]:
    started = time.perf_counter()
    result = compress(model, tokens)
    encoded = time.perf_counter()
    decoded = decompress(model, result.data)
    finished = time.perf_counter()
    _exact(decoded.tokens, tokens, "codec")
    return Run(name, "codec (token-by-token)", "-", len(tokens), len(tokens), 0.0,
               encoded - started, finished - encoded, result.stats.code_bits,
               result.stats.cross_entropy_bits, (1,) * len(tokens)), result.data


def decode_seconds(model: CausalLM, data: bytes) -> float:
    started = time.perf_counter()
    decompress(model, data)
    return time.perf_counter() - started


def replay_run(model: CausalLM, name: str, tokens: list[int], policy: DraftPolicy) -> Run:
    started = time.perf_counter()
    coded = speculative_encode(model, tokens, policy)
    encoded = time.perf_counter()
    decoded = speculative_decode(model, coded, policy)
    finished = time.perf_counter()
    _exact(decoded.tokens, tokens, f"replay {policy.name}")
    stats = decoded.stats
    return Run(name, "replay", policy.name, stats.forwards, len(tokens), stats.acceptance,
               encoded - started, finished - encoded, coded.code.num_bits,
               coded.cross_entropy_bits, stats.forward_lengths)


def blocked_run(model: CausalLM, name: str, tokens: list[int], blocks: int | tuple[int, ...],
                policy: DraftPolicy, label: str) -> Run:
    started = time.perf_counter()
    coded = blocked_encode(model, tokens, blocks)
    encoded = time.perf_counter()
    decoded = blocked_decode(model, coded, policy)
    finished = time.perf_counter()
    _exact(decoded.tokens, tokens, f"{label} {policy.name}")
    stats = decoded.stats
    return Run(name, label, policy.name, stats.forwards, len(tokens), stats.acceptance,
               encoded - started, finished - encoded, coded.code.num_bits,
               coded.cross_entropy_bits, stats.forward_lengths)


def prototype_runs(model: CausalLM, name: str, tokens: list[int], costs: Costs,
                   quick: bool) -> tuple[list[Run], tuple[int, ...]]:
    replay: list[DraftPolicy] = [PromptLookup(max_draft=8), Fallback(PromptLookup(max_draft=8),
                                                                    JacobiDraft(max_draft=3))]
    if not quick:
        replay = [PromptLookup(max_draft=4), *replay[:1], PromptLookup(max_draft=16),
                  PromptLookup(min_ngram=2, max_draft=8), JacobiDraft(max_draft=3), replay[1]]
    blocked: list[tuple[int, DraftPolicy]] = [
        (16, Fallback(PromptLookup(max_draft=16), JacobiDraft(max_draft=16)))]
    if not quick:
        blocked = [(8, Fallback(PromptLookup(max_draft=8), JacobiDraft(max_draft=8))),
                   *blocked, (16, NoDraft())]
    codec, data = codec_run(model, name, tokens)
    runs = [codec]
    print(f"  {name}: codec", flush=True)
    for policy in replay:
        runs.append(replay_run(model, name, tokens, policy))
        print(f"  {name}: replay {policy.name}", flush=True)
    for block, policy in blocked:
        runs.append(blocked_run(model, name, tokens, block, policy, f"blocked {block}"))
        print(f"  {name}: blocked {block} {policy.name}", flush=True)
    lookup = PromptLookup(max_draft=32)
    cost = table_cost({t.size: t.seconds for t in costs.chunk})
    plan = plan_blocks(tokens, lookup, cost, PLAN_LENGTHS)
    runs.append(blocked_run(model, name, tokens, plan, lookup, "blocked, planned"))
    print(f"  {name}: blocked, planned", flush=True)
    # NOTE: the codec is timed again after the prototypes, and the faster of its two decodes is
    # the baseline: a load spike on the shared machine must not flatter the prototypes.
    again = decode_seconds(model, data)
    runs[0] = dataclasses.replace(codec, decode_seconds=min(codec.decode_seconds, again))
    return runs, plan


def prototype_section(runs: list[Run], costs: Costs) -> str:
    body = []
    for run in runs:
        base = next(r for r in runs if r.text == run.text and r.schedule.startswith("codec"))
        body.append([
            run.text, run.schedule, run.policy, run.forwards, f"{run.tokens / run.forwards:.2f}",
            f"{run.acceptance:.0%}", f"{run.encode_seconds:.1f}", f"{run.decode_seconds:.1f}",
            f"{run.tokens_per_second:.1f}", f"{run.tokens_per_second / base.tokens_per_second:.2f}",
            f"{base.modelled_seconds(costs) / run.modelled_seconds(costs):.2f}",
            f"{run.code_bits / run.tokens:.3f}", f"{run.cross_entropy_bits / run.tokens:.4f}",
            f"{(run.cross_entropy_bits - base.cross_entropy_bits) / run.tokens:+.1e}",
        ])
    return table(["text", "schedule", "draft policy", "forwards", "tokens / forward",
                  "guesses accepted", "encode s", "decode s", "decode tokens / s",
                  "x codec, measured", "x codec, cost model", "coded bits / token",
                  "cross-entropy bits / token", "cross-entropy - codec's"], body)


# rate-compute dial -------------------------------------------------------------------------


def dial_section(model: CausalLM, tokens: list[int], costs: Costs
                 ) -> tuple[str, list[tuple[int, float, float]]]:
    """Split one session into S independently coded segments, decoded as a batch of S."""
    count = len(tokens)
    prefill = count * costs.chunk_seconds(32) / 32
    body = []
    found: list[tuple[int, float, float]] = []
    base_bits = 0
    for segments in [s for s in (1, 2, 4, 8, 16) if s <= max(t.size for t in costs.batch)]:
        length = -(-count // segments)
        parts = [tokens[i : i + length] for i in range(0, count, length)]
        coded = [blocked_encode(model, part, 32) for part in parts]
        bits = sum(c.code.num_bits for c in coded)
        base_bits = base_bits or bits
        step = costs.batch_seconds(len(parts))
        seconds = length * step + (prefill if segments > 1 else 0.0)
        body.append([segments, length, f"{bits / count:.3f}", f"{bits / base_bits - 1:+.1%}",
                     f"{1e3 * step:.0f}", f"{count / seconds:.0f}"])
        found.append((segments, bits / base_bits - 1, count / seconds))
        print(f"  dial: {segments} segments", flush=True)
    text = (
        f"One session of {count} tokens (all of `sample.txt`) cut into S segments of equal "
        "length, each coded on its own (first token after the start token, no earlier "
        "context; the bits are real code lengths of `blocked_encode`). A decoder steps the S "
        "segments as one batch, then rebuilds the session's KV with one prefill "
        f"({prefill:.1f} s, counted for S > 1). The speed is an *estimate* from the measured "
        "costs of (c), not a run: batched exact decoding needs the encoder to replay the "
        "batch shape (see (b)), which no prototype here does yet.\n\n"
        + table(["S", "tokens / segment", "coded bits / token", "bits vs S = 1",
                 "ms / batched step", "est. decode tokens / s"], body)
    )
    return text, found


# report ------------------------------------------------------------------------------------


def _identical(results: list[probes.RowComparison], case: str) -> bool:
    return next(r.bit_identical for r in results if r.case == case)


def conclusion(exact: dict[str, bool], batches: list[probes.RowComparison],
               batch_sizes: list[int], costs: Costs, runs: list[Run],
               dial: list[tuple[int, float, float]]) -> str:
    single = costs.chunk_seconds(1)
    chunked_exact = [k for k, v in exact.items() if k.startswith("chunks") and v]
    later_exact = all(v for k, v in exact.items() if k.startswith("later tokens"))
    aligned = exact.get("rows chunks of 16 = prefill", False) and exact.get(
        "KV chunks of 16 = prefill", False)
    largest = max(t.size for t in costs.batch)
    floor = costs.weight_bytes / costs.bandwidth
    probed = max(batch_sizes)
    equal_ok = all(_identical(batches, f"equal lengths, batch {b} vs batch {probed}")
                   for b in batch_sizes if b >= 4)
    pad_same = all(_identical(batches, f"padded by {p}, batch {b} vs batch {probed} padded by {p}")
                   for b in batch_sizes if b >= 4 for p in (2, 6))
    pad_other = _identical(batches, f"padded by 6, batch {probed} vs padded by 2")
    segments, extra_bits, dial_speed = dial[-1]

    def best(text: str, prefix: str) -> Run:
        candidates = [r for r in runs if r.text == text and r.schedule.startswith(prefix)]
        return max(candidates, key=lambda r: r.tokens_per_second)

    lines = []
    for text in dict.fromkeys(r.text for r in runs):
        base = best(text, "codec")
        replay, fixed, planned = best(text, "replay"), best(text, "blocked 16"), best(
            text, "blocked, planned")

        def speed(run: Run, base: Run = base) -> str:
            return (f"{run.tokens / run.forwards:.2f} tokens/forward, "
                    f"{run.tokens_per_second / base.tokens_per_second:.2f}x the codec's decode "
                    f"speed ({base.modelled_seconds(costs) / run.modelled_seconds(costs):.2f}x "
                    "by the cost model)")

        lines.append(
            f"- {text}: replay, best policy ({replay.policy}): {speed(replay)}; blocks of 16, "
            f"best policy ({fixed.policy}): {speed(fixed)}, its encoder (a blocked prefill) "
            f"{base.encode_seconds / fixed.encode_seconds:.0f}x faster than the codec's; "
            f"planned partition: {speed(planned)}.")
    return "\n".join([
        "**Exact schedules on this backend.** "
        + ("Only token-by-token forwards reproduce token-by-token rows: "
           if not chunked_exact else "Chunked schedules equal to token-by-token: "
           f"{', '.join(chunked_exact)}. ")
        + "every chunked schedule moves rows by up to ~1e-4, so a stream coded on one schedule "
        "cannot be decoded on another. The linear layers alone explain part of it: a matmul "
        "of 1 to 3 rows takes another kernel than one of 4 or more (table above). "
        + ("Chunks of 16 or 32 that start at multiples of 16 reproduce one prefill bit for "
           "bit, rows and KV, while shifted boundaries or shorter chunks do not: an artefact "
           "of this backend's kernels, useful (a blocked-16 stream's KV is the prefill's) but "
           "not something a format may assume. " if aligned else "")
        + "What every probe confirms is that the same forward shapes on the same cache states "
        "give the same bits, and "
        + ("that a row does not depend on the tokens after it in its forward (every chunk "
           "size, rows and KV). " if later_exact else
           "NOT that rows ignore later tokens (see the table). ")
        + "So both prototypes are exact: replay fixes the whole schedule, guesses included; "
        "blocked fixes only the forward shapes (the partition) and lets the guesses vary.",
        "",
        "**Speculative decoding.** Speed = tokens per forward / (cost of one chunk forward in "
        "units of a one-position forward). A chunk of 8 costs "
        f"{costs.chunk_seconds(8) / single:.2f}x and a chunk of 16 "
        f"{costs.chunk_seconds(16) / single:.2f}x one position, and chunks of 2 or 3 cost more "
        "than a chunk of 4, so guesses pay only where they hold that often:",
        *lines,
        "- The coded bits equal the cross-entropy of the rows used, within the coder's 2-bit "
        "allowance, and that cross-entropy differs from the codec's by rounding only "
        "(last column): speculation costs no rate.",
        "- Prompt lookup gains only where the text repeats itself: a little of the code, "
        "almost none of the prose (where longer chunks cost more than they save), and the "
        "second half of the quoted prose (near the best case for lookup). Jacobi guesses "
        "(argmax of rows computed after a wrong guess) almost never hold on this model. "
        "The planned partition is never much slower than the codec (blocks of one where "
        "nothing repeats) and takes long blocks where the text repeats. Long sessions were "
        "not measured here.",
        "",
        f"**Batching.** One step of {largest} sessions costs "
        f"{costs.batch_seconds(largest) / single:.2f}x one session's step: "
        f"{largest * single / costs.batch_seconds(largest):.1f}x the aggregate token rate, "
        "whatever the text. A session's rows in a batch differ from its rows alone"
        + (", but equal-length batches of 4 or more agree with each other bit for bit"
           if equal_ok else "")
        + (", and so do padded batches of 4 or more with the same padding" if pad_same else "")
        + ("; the amount of left padding changes the rows" if not pad_other else "")
        + ". So an exactly decodable batch needs a canonical shape: every matmul of at least 4 "
        "rows (a lone session padded with dummy rows) and no padding inside attention "
        "(attention run per session on its own cache, or sessions of equal length). "
        f"For one file, cutting it into independent segments decoded as a batch trades rate "
        f"for speed: {segments} segments of `sample.txt` would decode at an estimated "
        f"{dial_speed:.0f} tokens/s for {extra_bits:+.0%} bits (dial table).",
        "",
        f"**What bounds each.** A forward streams all {costs.weight_bytes / 1e6:.0f} MB of "
        f"weights: {1e3 * floor:.0f} ms at the measured {costs.bandwidth / 1e9:.1f} GB/s, "
        f"{floor / single:.0%} of a one-position forward ({1e3 * single:.0f} ms); the rest is "
        "compute and per-operator dispatch. Token-by-token decoding pays all of it per token; a "
        "chunk or a batch shares it among its positions: per-position cost falls to "
        f"{1e3 * costs.chunk_seconds(32) / 32:.1f} ms at chunk 32 "
        f"({32 / costs.chunk_seconds(32):.0f} positions/s, the prefill regime) and the batch "
        f"aggregate reaches {largest / costs.batch_seconds(largest):.0f} tokens/s at "
        f"{largest}. Speculation reaches that regime only as far as its guesses hold; batching "
        "always, but only across independent streams.",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128, help="positions per text")
    parser.add_argument("--quick", action="store_true", help="fewer cases (a smoke run)")
    parser.add_argument("-o", "--output", type=Path,
                        default=Path(__file__).resolve().parent.parent / "reports"
                        / "decode_schedules.md")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    model = load_default_model()
    header = start_run(model.name, f"the first {args.tokens} tokens of "
                                   "`src/seqkv/data/sample.txt` and of this script's Python "
                                   "snippet")
    _ = model.identity  # NOTE: hashed once here (~1 s), not inside the codec's first timing
    prose_all = model.encode_text(
        (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8"))
    texts = {"prose": prose_all[: args.tokens],
             "code": model.encode_text(CODE_SAMPLE)[: args.tokens]}
    print("(a) chunk boundaries", flush=True)
    sections = []
    exact: dict[str, dict[str, bool]] = {}
    for name, tokens in texts.items():
        text, exact[name] = chunk_section(model, name, tokens, args.quick)
        sections.append(text)
    print("(b) batches", flush=True)
    window = 24
    sessions = [prose_all[window * i : window * (i + 1)] for i in range(16)]
    batch_text, batch_results, batch_sizes = batch_section(model, sessions, args.quick)
    print("(c) timing", flush=True)
    timing_text, costs = timing_section(model, texts["prose"], args.quick)
    print("prototypes", flush=True)
    print("rate-compute dial", flush=True)
    dial_text, dial = dial_section(model, prose_all, costs)
    runs: list[Run] = []
    plans: dict[str, tuple[int, ...]] = {}
    half = len(texts["prose"]) // 2
    quoted = {**texts, "quoted prose": texts["prose"][:half] * 2}
    for name, tokens in quoted.items():
        found, plans[name] = prototype_runs(model, name, tokens, costs, args.quick)
        runs += found
    report = "\n".join([
        "# Decoding schedules: exactness and cost (issue 5 groundwork)",
        "",
        "Generated by `benchmarks/decode_schedules.py`"
        + (" (--quick)" if args.quick else "") + f" in {time.perf_counter() - started:.0f} s.",
        "",
        f"- Model: {model.name}; {model.num_layers} layers, {model.kv_heads} KV heads, "
        f"vocabulary {model.vocab_size}; float32.",
        "- Threads: one intra-op thread "
        "(`seqkv.schedule.pinned_threads`), numpy's OpenBLAS on one thread "
        f"(OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}: the codec's `np.dot` "
        "otherwise wakes BLAS threads that halve its decode speed on a loaded machine). "
        f"torch {torch.__version__}, transformers "
        f"{transformers.__version__}, Python {platform.python_version()}.",
        f"- Data: prose = the first {len(texts['prose'])} tokens of `src/seqkv/data/sample.txt`; "
        f"code = the first {len(texts['code'])} tokens of the Python snippet in this script; "
        "quoted prose (prototypes only) = the first half of the prose tokens, twice. "
        "Timings are wall seconds on a shared machine: compare within a table, not across runs.",
        "",
        "## (a) Chunk-boundary invariance",
        "",
        *[s + "\n" for s in sections],
        "The code text gives the same verdicts as the prose." if exact["code"] == exact["prose"]
        else "The code text's verdicts differ from the prose's: see its tables.",
        "",
        linear_section(model),
        "",
        "## (b) Batch invariance",
        "",
        batch_text,
        "",
        "## (c) Forward cost",
        "",
        timing_text,
        "",
        "## Speculative prototypes against the codec",
        "",
        "Both prototypes decode every token exactly (checked against the input; the script "
        "stops otherwise) and end with the encoder's cache, bit for bit. *replay*: "
        "`research.decoding.speculative`, the encoder runs the decoder's forwards, guesses "
        "included. *blocked B*: `research.decoding.blocked`, the encoder is a prefill in aligned "
        "blocks of B, the decoder re-forwards whole blocks with guesses. 'tokens / forward' "
        "excludes the start token's forward. 'x codec, measured': decode speed relative to "
        "`seqkv.decompress` on the same tokens (the faster of two codec decodes, one before "
        "and one after the prototypes). 'x codec, cost model': the same ratio with every "
        "forward costed by the chunk-length curve of (c), so load changes on the shared "
        "machine during the run cannot move it.",
        "",
        prototype_section(runs, costs),
        "",
        "*blocked, planned*: the encoder chose the partition (`research.decoding.plan`, lengths "
        f"{list(PLAN_LENGTHS)}, the measured forward costs of (c), prompt lookup of up to 32 "
        "tokens as the decoder's policy). Blocks per length: "
        + "; ".join(f"{name} " + ", ".join(f"{n}x{length}" for length, n in sorted(
            Counter(plan).items())) for name, plan in plans.items()) + ".",
        "",
        "## A rate-compute dial for one session: independent segments, batched",
        "",
        dial_text,
        "",
        "## Conclusion",
        "",
        conclusion(exact["prose"], batch_results, batch_sizes, costs, runs, dial),
        "",
    ])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(headed(report, header.finished()), encoding="utf-8")
    print(f"wrote {args.output} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    if os.environ.get("OPENBLAS_NUM_THREADS") != "1":
        # NOTE: seqkv.codec's trace calls np.dot, which wakes numpy's OpenBLAS threads; on a
        # loaded 2-core machine their spinning halves the pinned torch thread's speed (codec
        # decode measured at 9 instead of 18 tokens/s). One BLAS thread keeps the baseline at
        # the codec's intended speed. The variable must be set before numpy loads: re-execute.
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    raise SystemExit(main())

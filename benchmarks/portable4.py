"""The 4-bit integer predictor (``portable4``) against the int8 one (``portable``): step time,
bytes read per step, bits against the float model on shipped and held-out texts.

* bits/token: each predictor's coder tables (``seqkv.models.integer.table``) against the float
  model's cross-entropy on the same positions (each token after the start token and the tokens
  before it), on the first ``--tokens`` tokens of the four shipped texts (``seqkv/data``) and on
  the whole of four held-out texts (``benchmarks/texts/heldout``: written for this benchmark,
  never used to choose anything in the 4-bit predictor);
* bytes of weights one forward reads (``IntegerForward.weight_bytes``) and of integer KV at the
  step's context;
* step time: one forward of one row (one session, one new token) after ``--context`` tokens,
  int8 and 4-bit alternately in one loop (so both meet the same load), on ``--threads``; the
  same for the first 6 and 18 layers (a line through bytes and time: the weights' bandwidth and
  what a step costs besides its weights); and one forward of 4 rows (a drafted chunk);
* prefill: ``--tokens`` rows of the prose text in one forward, alternately.

Timings are wall-clock medians, 25th percentiles and minima over ``--repeats`` alternations,
with process CPU time beside them, and the load average before and after (the machine is
shared). Writes ``--markdown`` (default ``reports/portable4.md``) and prints the JSON.

Usage: ``PYTHONPATH=src python benchmarks/portable4.py [--tokens 256] [--context 128]
[--repeats 60] [--threads 2] [--markdown reports/portable4.md]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from seqkv.coding.frequencies import FREQUENCY_BITS
from seqkv.models import CausalLM, load_default_model
from seqkv.models.integer import IntegerForward, IntegerWeights, integer_tables, integer_weights
from seqkv.models.integer.blocks import BlockWeights, block_weights
from seqkv.provenance import RunHeader, start_run
from seqkv.schedule import pinned_threads

HERE = Path(__file__).resolve().parent
SHIPPED = {"prose": "sample.txt", "code": "kinds/code.txt", "legal": "kinds/legal.txt",
           "technical": "kinds/technical.txt"}
HELD_OUT = HERE / "texts" / "heldout"
BITS_TARGET = 0.01  # at most +1% over the float model's cross-entropy
STEP_TARGET = 0.7  # a 4-bit step at most 0.7x the int8 step
FORMATS = ("int8", "q4")


@dataclass(frozen=True)
class TextBits:
    text: str
    source: str  # shipped or held-out
    tokens: int
    float_cross_entropy: float  # bits/token: float64 softmax of transformers' float32 logits
    int8_bits: float  # bits/token under the int8 predictor's coder tables
    q4_bits: float  # bits/token under the 4-bit predictor's coder tables
    int8_relative: float  # int8_bits / float_cross_entropy - 1
    q4_relative: float


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p25_ms: float
    min_ms: float
    cpu_median_ms: float  # process CPU time (both threads summed on 2)


@dataclass(frozen=True)
class Pair:
    """One workload timed alternately on both predictors."""

    workload: str
    layers: int
    rows: int
    int8: Timing
    q4: Timing
    int8_weight_mb: float
    q4_weight_mb: float
    ratio_median: float  # q4 / int8, wall-clock medians
    ratio_min: float
    ratio_cpu: float  # q4 / int8, medians of process CPU time


@dataclass(frozen=True)
class StepFit:
    """Least squares over the one-row steps of both formats at 6, 18 and 30 layers:
    ``ms = fixed_ms + layers * per_layer_ms + weight_mb / bandwidth_gb_s``. The work that does
    not depend on the weights' format (attention over the KV, norms, requantization, the Python
    step) is the same on both sides, so it has one coefficient, and so do the weights' bytes."""

    fixed_ms: float  # embedding, final norm and the step's own overhead, besides the head's bytes
    per_layer_ms: float  # a layer's work besides its weights' bytes
    bandwidth_gb_s: float  # weight MB per ms
    besides_weights_ms: float  # fixed_ms + all layers * per_layer_ms
    ratio_fit: float  # the fit's 4-bit / int8 full step
    # the most the work besides the weights may cost for a 0.7x step at this bandwidth
    besides_limit_ms: float


@dataclass(frozen=True)
class Report:
    header: RunHeader
    threads: int
    context: int
    repeats: int
    int8_digest: str
    q4_digest: str
    kv_mb_at_context: float  # integer KV one step reads at the context, both predictors
    bits: list[TextBits]
    pairs: list[Pair]
    steps: StepFit  # the one-row steps' time split into weights and the rest
    read_gb_s: float  # the machine's one-thread read of a weight-sized array (numpy sum)
    held_out_bits_met: bool
    step_target_met: bool


def _texts(model: CausalLM, tokens: int) -> dict[tuple[str, str], list[int]]:
    texts = {}
    for name, file in SHIPPED.items():
        text = (importlib.resources.files("seqkv") / "data" / file).read_text("utf-8")
        texts[(name, "shipped")] = model.encode_text(text)[:tokens]
    for path in sorted(HELD_OUT.glob("*.txt")):
        texts[(path.stem, "held-out")] = model.encode_text(path.read_text("utf-8"))
    return texts


def _float_log2p(model: CausalLM, inputs: list[int]) -> np.ndarray:
    with torch.inference_mode():
        logits = model.model(input_ids=torch.tensor([inputs])).logits[0].double().numpy()
    shifted = logits - logits.max(-1, keepdims=True)
    return np.asarray((shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))) / np.log(2))


def _table_bits(engine: IntegerForward, inputs: list[int], tokens: list[int]) -> float:
    rows = engine.forward([(engine.new_sequence(), inputs)])[0]
    tables = integer_tables(rows).cumulative
    picked, target = np.arange(len(tokens)), np.array(tokens)
    counts = (tables[picked, target + 1] - tables[picked, target]).astype(np.float64)
    return float(np.mean(FREQUENCY_BITS - np.log2(counts)))


def _bits(model: CausalLM, engines: dict[str, IntegerForward],
          texts: dict[tuple[str, str], list[int]]) -> list[TextBits]:
    rows = []
    start = model.start_token_id
    for (name, source), tokens in texts.items():
        inputs = [start if start is not None else tokens[0], *tokens[:-1]]
        log2p = _float_log2p(model, inputs)
        cross_entropy = float(-log2p[np.arange(len(tokens)), np.array(tokens)].mean())
        int8, q4 = (_table_bits(engines[f], inputs, tokens) for f in FORMATS)
        rows.append(TextBits(name, source, len(tokens), cross_entropy, int8, q4,
                             int8 / cross_entropy - 1, q4 / cross_entropy - 1))
    return rows


def _timing(wall: list[float], cpu: list[float]) -> Timing:
    ordered = sorted(wall)
    return Timing(1000 * statistics.median(wall), 1000 * ordered[len(ordered) // 4],
                  1000 * ordered[0], 1000 * statistics.median(cpu))


def _alternate(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, Timing]:
    """Every run once per round, in a fixed order, ``repeats`` rounds (after one warm-up)."""
    for run in runs.values():
        run()
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {name: _timing(wall[name], cpu[name]) for name in runs}


def _forward_run(engine: IntegerForward, context: list[int], rows: int) -> Callable[[], object]:
    """One forward of ``rows`` new tokens after ``context`` (cropped back each time)."""
    sequence = engine.new_sequence()
    engine.forward([(sequence, context)])
    length = sequence.length
    chunk = context[-rows:]

    def run() -> None:
        sequence.crop(length)
        engine.forward([(sequence, chunk)])

    return run


def _prefill_run(engine: IntegerForward, tokens: list[int]) -> Callable[[], object]:
    return lambda: engine.forward([(engine.new_sequence(), tokens)])


def _step_fit(pairs: list[Pair], layers: int) -> StepFit:
    steps = [p for p in pairs if p.workload == "step"]
    rows = [(p.layers, getattr(p, f"{form}_weight_mb"), getattr(p, form).median_ms)
            for p in steps for form in FORMATS]
    design = np.array([[1.0, layer_count, mb] for layer_count, mb, _ in rows])
    fixed, per_layer, per_mb = np.linalg.lstsq(design, np.array([ms for *_, ms in rows]),
                                               rcond=None)[0]
    full = next(p for p in steps if p.layers == layers)
    besides = fixed + layers * per_layer
    ratio = (besides + full.q4_weight_mb * per_mb) / (besides + full.int8_weight_mb * per_mb)
    limit = (STEP_TARGET * full.int8_weight_mb - full.q4_weight_mb) * per_mb / (1 - STEP_TARGET)
    return StepFit(float(fixed), float(per_layer), float(1.0 / per_mb), float(besides),
                   float(ratio), float(limit))


def _read_bandwidth(megabytes: float, repeats: int = 9) -> float:
    """GB/s of one thread summing a ``megabytes`` array of uint64 (median of ``repeats``)."""
    array = np.ones(int(megabytes * 1e6) // 8, dtype=np.uint64)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        array.sum()
        times.append(time.perf_counter() - start)
    return array.nbytes / statistics.median(times) / 1e9


def measure(args: argparse.Namespace) -> Report:
    model = load_default_model()
    header = start_run(model.name, f"the shipped and held-out texts, {args.tokens} tokens each; "
                                   f"steps at a {args.context}-token context",
                       f"python benchmarks/portable4.py --repeats {args.repeats} --threads "
                       f"{args.threads} --context {args.context}")
    weights: dict[str, IntegerWeights | BlockWeights] = {"int8": integer_weights(model),
                                                          "q4": block_weights(model)}
    engines = {form: IntegerForward(weights[form]) for form in FORMATS}
    texts = _texts(model, args.tokens)
    with pinned_threads(args.threads):
        bits = _bits(model, engines, texts)
        prose = texts[("prose", "shipped")]
        context = prose[: args.context]
        runs: dict[str, Callable[[], object]] = {}
        sizes: dict[str, float] = {}
        workloads = [("step", layers, 1) for layers in (6, 18, model.num_layers)]
        workloads += [("drafted chunk", model.num_layers, 4)]
        for workload, layers, rows in workloads:
            for form in FORMATS:
                engine = IntegerForward(weights[form], layers=layers)
                key = f"{workload}:{layers}:{rows}:{form}"
                runs[key] = _forward_run(engine, context, rows)
                sizes[key] = engine.weight_bytes() / 1e6
        for form in FORMATS:
            key = f"prefill:{model.num_layers}:{len(prose)}:{form}"
            runs[key] = _prefill_run(engines[form], prose)
            sizes[key] = engines[form].weight_bytes() / 1e6
        timings = _alternate({k: v for k, v in runs.items() if not k.startswith("prefill")},
                             args.repeats)
        timings |= _alternate({k: v for k, v in runs.items() if k.startswith("prefill")},
                              max(3, args.repeats // 10))
    pairs = []
    for key in runs:
        if not key.endswith(":int8"):
            continue
        workload, layer_count, row_count, _ = key.split(":")
        other = key.removesuffix("int8") + "q4"
        a, b = timings[key], timings[other]
        pairs.append(Pair(workload, int(layer_count), int(row_count), a, b, sizes[key],
                          sizes[other], b.median_ms / a.median_ms, b.min_ms / a.min_ms,
                          b.cpu_median_ms / a.cpu_median_ms))
    fit = _step_fit(pairs, model.num_layers)
    geometry = engines["int8"].geometry
    kv = (geometry.layers * 2 * args.context
          * (2 * geometry.kv_heads * geometry.head_dim + geometry.heads)) / 1e6
    full_step = next(p for p in pairs if p.workload == "step" and p.layers == model.num_layers)
    return Report(
        header=header.finished(), threads=args.threads,
        context=args.context, repeats=args.repeats, int8_digest=engines["int8"].digest,
        q4_digest=engines["q4"].digest, kv_mb_at_context=kv, bits=bits, pairs=pairs,
        steps=fit, read_gb_s=_read_bandwidth(full_step.int8_weight_mb),
        held_out_bits_met=all(b.q4_relative <= BITS_TARGET for b in bits
                              if b.source == "held-out"),
        step_target_met=full_step.ratio_median <= STEP_TARGET)


def render(report: Report) -> str:
    """The markdown report."""
    lines = [
        "# portable4: the 4-bit integer predictor against the int8 one",
        "",
        report.header.markdown(),
        "",
        "Every timing is an alternation of the two predictors in one loop, so both meet the "
        "same load.",
        "",
        f"Predictor digests: int8 `{report.int8_digest[:16]}`, 4-bit `{report.q4_digest[:16]}`.",
        "",
        "## Bits per token against the float model",
        "",
        "Each predictor's coder tables against the float model's cross-entropy on the same "
        "positions. Held-out texts: `benchmarks/texts/heldout/`, written for this benchmark "
        "and used to choose nothing.",
        "",
        "| text | source | tokens | float cross-entropy | int8 | vs float | 4-bit | vs float |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for b in report.bits:
        lines.append(f"| {b.text} | {b.source} | {b.tokens} | {b.float_cross_entropy:.4f} | "
                     f"{b.int8_bits:.4f} | {b.int8_relative:+.2%} | {b.q4_bits:.4f} | "
                     f"{b.q4_relative:+.2%} |")
    met = "met" if report.held_out_bits_met else "NOT met"
    lines += ["", f"Target (4-bit within +1% of the float model on the held-out texts): {met}.",
              "", "## Time per forward, bytes read", "",
              f"One forward after {report.context} tokens of the prose text, on "
              f"{report.threads} thread(s); milliseconds of wall time (median, 25th "
              "percentile, minimum; median process CPU time). Weight MB: bytes of weights the "
              "forward reads (`IntegerForward.weight_bytes`); both also read "
              f"{report.kv_mb_at_context:.2f} MB of integer KV at this context.", "",
              "| forward | layers | rows | int8 weight MB | 4-bit weight MB | int8 ms | 4-bit ms "
              "| 4-bit / int8 (median) | (min) | (CPU time) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in report.pairs:
        lines.append(
            f"| {p.workload} | {p.layers} | {p.rows} | {p.int8_weight_mb:.1f} | "
            f"{p.q4_weight_mb:.1f} | {p.int8.median_ms:.2f} / {p.int8.p25_ms:.2f} / "
            f"{p.int8.min_ms:.2f} (cpu {p.int8.cpu_median_ms:.2f}) | {p.q4.median_ms:.2f} / "
            f"{p.q4.p25_ms:.2f} / {p.q4.min_ms:.2f} (cpu {p.q4.cpu_median_ms:.2f}) | "
            f"{p.ratio_median:.3f} | {p.ratio_min:.3f} | {p.ratio_cpu:.3f} |")
    met = "met" if report.step_target_met else "NOT met"
    fit = report.steps
    full = next(p for p in report.pairs if p.workload == "step" and p.layers == max(
        q.layers for q in report.pairs))
    lines += [
        "", f"Target (a one-row step at most {STEP_TARGET}x the int8 step, medians): {met}.",
        "", "Where a step's time goes: a least-squares fit over the one-row steps of both "
        "formats at 6, 18 and 30 layers, `ms = fixed + layers x per-layer + weight MB / "
        "bandwidth`, with one coefficient each for both formats (the work besides the weights "
        "is the same on both sides):", "",
        f"- the weights stream at {fit.bandwidth_gb_s:.1f} GB/s (this machine reads "
        f"{report.read_gb_s:.1f} GB/s on one thread: numpy's sum of a "
        f"{full.int8_weight_mb:.0f} MB array);",
        f"- the work besides the weights: {fit.per_layer_ms:.3f} ms a layer (attention over "
        f"{report.context} tokens of KV, norms, requantization, RoPE) and {fit.fixed_ms:.2f} ms "
        f"a step (embedding, final norm, the step's own overhead): {fit.besides_weights_ms:.2f}"
        f" ms of the {full.layers}-layer step;",
        f"- so the fit's 4-bit / int8 step is {fit.ratio_fit:.3f} (measured "
        f"{full.ratio_median:.3f}); the weights' bytes alone give "
        f"{full.q4_weight_mb / full.int8_weight_mb:.3f}, and a {STEP_TARGET}x step at this "
        f"bandwidth would leave at most {max(fit.besides_limit_ms, 0.0):.2f} ms for everything "
        "besides the weights.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--markdown", type=Path, default=Path("reports") / "portable4.md")
    args = parser.parse_args()
    report = measure(args)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(render(report))
    print(json.dumps(dataclasses.asdict(report), indent=1))


if __name__ == "__main__":
    main()

"""Self-drafting (``seqkv.levels.layer_drafts``) against prompt-lookup drafting alone, per text
kind, at ``portable`` and ``portable4``.

Each text (the first ``--tokens`` tokens of the four shipped kinds, and with ``--held-out`` of
the four held-out texts of ``benchmarks/texts/heldout``) is coded once per level (default
``portable4``) without its KV (the tokens alone), then
its tokens are decoded (no KV prefill) with each drafter, the drafters alternating within each
of ``--repeats`` rounds:

* ``lookup``: the decoder's default, prompt lookup after a repeated 3-gram, up to 7 tokens;
* ``lookup+layersNxK``: prompt lookup, and where it guesses nothing, K greedy tokens of the
  level's own first N layers (``--layers``, ``--max-draft``);
* ``layersNxK``: the first N layers alone.

Every decode must return the coded tokens exactly (it raises otherwise). Reported per text,
level and drafter: full-predictor forwards, drafted and confirmed tokens (acceptance), the
drafter's own one-row forwards, decoded tokens per full forward, the median decode time and
the speed-up against ``lookup`` (its median time over this drafter's). Writes ``--markdown``
(default ``reports/self_drafting.md``) and prints the JSON.

Usage: ``PYTHONPATH=src python benchmarks/self_drafting.py [--tokens 120] [--repeats 2]
[--layers 12 24] [--max-draft 2] [--levels portable4] [--held-out]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqkv.coding.arithmetic import ArithmeticDecoder
from seqkv.errors import DecodeVerificationError
from seqkv.formats.skv import read_skv
from seqkv.levels import parse_level
from seqkv.levels.base import DecodeRequest
from seqkv.levels.layer_drafts import DraftCounts, LayerDrafter, StreamDrafter
from seqkv.levels.portable import PortableLevel, default_drafter
from seqkv.models import CausalLM, load_default_model
from seqkv.models.integer import IntegerForward
from seqkv.provenance import RunHeader, start_run
from seqkv.skv import compress

HERE = Path(__file__).resolve().parent
SHIPPED = {"prose": "sample.txt", "code": "kinds/code.txt", "legal": "kinds/legal.txt",
           "technical": "kinds/technical.txt"}
HELD_OUT = HERE / "texts" / "heldout"


@dataclass(frozen=True)
class DrafterRun:
    text: str
    source: str  # shipped or held-out
    level: str
    drafter: str
    tokens: int
    # positions where the full predictor's most likely token is the text's: the acceptance of a
    # drafter that guessed exactly what the full predictor ranks first
    full_top1: float
    forwards: int  # of the full predictor
    drafted: int
    accepted: int
    acceptance: float  # accepted / drafted
    draft_forwards: int  # the drafter's own one-row forwards
    tokens_per_forward: float
    # weights read per decoded token: the full forwards' and the drafter's (a proxy for decode
    # time where a forward is bound by its weights' memory traffic, independent of the load)
    weight_mb_per_token: float
    bytes_speedup_vs_lookup: float  # lookup's weight bytes per token over this drafter's
    decode_seconds: float  # median
    speedup_vs_lookup: float  # lookup's median time over this drafter's
    decode_cpu_seconds: float  # median process CPU time (both threads)


@dataclass(frozen=True)
class Report:
    header: RunHeader
    repeats: int
    runs: list[DrafterRun]


def _texts(model: CausalLM, tokens: int, held_out: bool) -> dict[tuple[str, str], list[int]]:
    texts = {}
    for name, file in SHIPPED.items():
        text = (importlib.resources.files("seqkv") / "data" / file).read_text("utf-8")
        texts[(name, "shipped")] = model.encode_text(text)[:tokens]
    for path in sorted(HELD_OUT.glob("*.txt")) if held_out else []:
        texts[(path.stem, "held-out")] = model.encode_text(path.read_text("utf-8"))[:tokens]
    return texts


def _top1(engine: IntegerForward, model: CausalLM, tokens: list[int]) -> float:
    """The fraction of positions whose next token is the predictor's most likely one."""
    start = model.start_token_id
    inputs = [start if start is not None else tokens[0], *tokens[:-1]]
    rows = engine.forward([(engine.new_sequence(), inputs)])[0]
    return float((rows.argmax(-1) == np.array(tokens)).mean())


def _weight_bytes(drafter: StreamDrafter) -> int:
    """Weight bytes of one of the drafter's own forwards (0 for prompt lookup)."""
    return drafter.engine.weight_bytes() if isinstance(drafter, LayerDrafter) else 0


def _decode(model: CausalLM, level: PortableLevel, data: bytes, drafter: StreamDrafter,
            expected: list[int]) -> tuple[float, float, DraftCounts]:
    session = read_skv(data).session
    request = DecodeRequest(ArithmeticDecoder(session.token_code), session.count,
                            list(session.segments), model.start_token_id, model.vocab_size, None,
                            with_kv=False)
    counts = DraftCounts()
    start, start_cpu = time.perf_counter(), time.process_time()
    output = level.decode_drafted(model, [request], drafter, counts)[0]
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if output.tail != expected:
        raise DecodeVerificationError(f"the {drafter.name} drafter decoded other tokens")
    return seconds, cpu, counts


def measure(args: argparse.Namespace) -> Report:
    model = load_default_model()
    command = (f"python benchmarks/self_drafting.py --tokens {args.tokens} --repeats "
               f"{args.repeats} --layers {' '.join(map(str, args.layers))} --max-draft "
               f"{args.max_draft} --levels {' '.join(args.levels)}"
               f"{' --held-out' if args.held_out else ''}")
    texts_named = "the shipped and held-out texts" if args.held_out else "the shipped texts"
    header = start_run(model.name, f"{texts_named}, first {args.tokens} tokens each", command)
    texts = _texts(model, args.tokens, args.held_out)
    runs = []
    for level_name in args.levels:
        level = parse_level(level_name)
        assert isinstance(level, PortableLevel)
        drafters: dict[str, StreamDrafter] = {"lookup": default_drafter()}
        for layers in args.layers:
            after = level.layer_drafter(model, layers, args.max_draft)
            drafters[after.name.replace(default_drafter().name, "lookup")] = after
        alone = level.layer_drafter(model, max(args.layers), args.max_draft, after_lookup=False)
        drafters[alone.name] = alone
        for (name, source), tokens in texts.items():
            data = compress(model, tokens, level=level_name).data
            top1 = _top1(level.engine(model), model, tokens)
            seconds: dict[str, list[float]] = {d: [] for d in drafters}
            cpu: dict[str, list[float]] = {d: [] for d in drafters}
            counts: dict[str, DraftCounts] = {}
            for _ in range(args.repeats):
                for label, drafter in drafters.items():
                    elapsed, used, counted = _decode(model, level, data, drafter, tokens)
                    seconds[label].append(elapsed)
                    cpu[label].append(used)
                    counts[label] = counted  # the same every repeat: a pure function
            lookup = statistics.median(seconds["lookup"])
            full = level.engine(model).weight_bytes()
            per_token = {label: (counts[label].rounds * full + counts[label].draft_forwards
                                 * _weight_bytes(drafter)) / len(tokens) / 1e6
                         for label, drafter in drafters.items()}
            for label in drafters:
                c, median = counts[label], statistics.median(seconds[label])
                runs.append(DrafterRun(
                    name, source, level_name, label, len(tokens), top1, c.rounds, c.drafted,
                    c.accepted, c.acceptance, c.draft_forwards, len(tokens) / c.rounds,
                    per_token[label], per_token["lookup"] / per_token[label], median,
                    lookup / median, statistics.median(cpu[label])))
                print(json.dumps(dataclasses.asdict(runs[-1])), flush=True)
    return Report(header.finished(), args.repeats, runs)


def render(report: Report) -> str:
    lines = [
        "# Self-drafting against prompt lookup",
        "",
        report.header.markdown(),
        "",
        "The integer forward runs on its 2 threads; the machine is shared: the drafters of one "
        "text alternate within each round. Every decode returned the coded tokens exactly. "
        "Decode time: the tokens alone (no KV prefill), median.",
        "",
        "Full top-1: positions where the full predictor's most likely token is the text's (what "
        "a drafter guessing exactly the full predictor's first choice would have confirmed). "
        "Acceptance: drafted tokens the decoded tokens confirmed, over drafted tokens verified. "
        "Weight MB / token: the weights every forward (the full predictor's and the drafter's "
        "own) reads, per decoded token: what a decode bound by its weights' memory traffic pays, "
        "whatever the load. Speed-up: prompt lookup's over the drafter's, in those bytes and in "
        "median decode time.",
        "",
        "| text | source | level | full top-1 | drafter | full forwards | drafted | confirmed "
        "| acceptance "
        "| drafter forwards | tokens / full forward | weight MB / token | speed-up in bytes "
        "| decode s (CPU s) | speed-up vs lookup |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report.runs:
        lines.append(
            f"| {r.text} | {r.source} | {r.level} | {r.full_top1:.1%} | {r.drafter} | "
            f"{r.forwards} | {r.drafted} "
            f"| {r.accepted} | {r.acceptance:.1%} | {r.draft_forwards} | "
            f"{r.tokens_per_forward:.2f} | {r.weight_mb_per_token:.1f} | "
            f"{r.bytes_speedup_vs_lookup:.2f}x | {r.decode_seconds:.2f} "
            f"({r.decode_cpu_seconds:.2f}) | {r.speedup_vs_lookup:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 24])
    parser.add_argument("--max-draft", type=int, default=2)
    parser.add_argument("--levels", nargs="+", default=["portable4"])
    parser.add_argument("--held-out", action="store_true",
                        help="also the held-out texts of benchmarks/texts/heldout")
    parser.add_argument("--markdown", type=Path, default=Path("reports") / "self_drafting.md")
    args = parser.parse_args()
    report = measure(args)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(render(report))
    print(json.dumps(dataclasses.asdict(report), indent=1))


if __name__ == "__main__":
    main()

"""The integer forward's speed on each native.c path this CPU runs, forced in turn in one run.

Per path (``native.ISAS`` that ``native.cpu_isas()`` lists, and ``--torch`` adds the torch
statement for the one-row step), on the embedded model (SmolLM2-135M) and the shipped prose
sample:

* ``step``: a one-row step after ``--context`` tokens (default 512), ``--steps`` steps timed one
  by one on ``--threads`` threads: minimum and median, milliseconds; for the int8 predictor
  (``portable``) and the 4-bit one (``portable4``);
* ``forward``: one forward of ``--rows`` rows (default 256) from an empty sequence, the median of
  ``--repeats``; int8 and 4-bit;
* ``demo``: ``seqkv demo --json`` run as a user runs it with ``SEQKV_INTEGER_ISA`` set to the
  path (a fresh process: model load, compress with the KV at ``portable``, verified decode, one
  float prefill and token-by-token generation for the ratios): file bytes, encode / one
  prefill, decode / token-by-token.

Beside them, one float prefill of ``--rows`` rows (the ``prefill`` schedule) for scale. The
paths alternate within each measurement, so a drift of the machine's speed spreads over all
of them. Writes ``--markdown`` (default ``reports/integer_paths.md``) after every path's demo,
with the machine, its load and the commit, and prints the JSON.

Usage: ``PYTHONPATH=src python benchmarks/integer_paths.py [--context 512] [--steps 30]
[--rows 256] [--repeats 3] [--threads 2] [--skip-demo] [--torch]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from seqkv.bench.texts import shipped_text
from seqkv.models import CausalLM, load_default_model
from seqkv.models.integer import IntegerForward, integer_weights, native
from seqkv.models.integer.blocks import block_weights
from seqkv.provenance import RunHeader, start_run
from seqkv.schedule import pinned_threads

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class PathRow:
    path: str
    step_ms: dict[str, tuple[float, float]] = field(default_factory=dict)  # predictor: min, median
    forward_ms: dict[str, float] = field(default_factory=dict)  # predictor: median
    demo: dict[str, float | int | str] = field(default_factory=dict)


@dataclass
class Report:
    header: RunHeader  # its load at the end follows each write
    context: int
    rows: int
    threads: int
    prefill_ms: float
    paths: list[PathRow]


def _engines(model: CausalLM, path: str) -> dict[str, IntegerForward]:
    if path == "torch":
        return {"int8": IntegerForward(integer_weights(model), backend="torch")}
    isa: native.Isa = path  # type: ignore[assignment]
    return {"int8": IntegerForward(integer_weights(model), isa=isa),
            "q4": IntegerForward(block_weights(model), isa=isa)}


def _steps(engine: IntegerForward, context: list[int], steps: list[int]) -> tuple[float, float]:
    sequence = engine.new_sequence()
    engine.forward([(sequence, context)])
    times = []
    for token in steps:
        started = time.perf_counter()
        engine.forward([(sequence, [token])])
        times.append((time.perf_counter() - started) * 1000)
    return min(times), statistics.median(times)


def _timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1000


def _demo(path: str) -> dict[str, float | int | str]:
    environment = {**os.environ, native.ISA_ENV: path, "HF_HUB_OFFLINE": "1",
                   "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "seqkv", "demo", "--json"],
                          capture_output=True, text=True, env=environment, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {"file_bytes": figures["file_bytes"], "encode_seconds": figures["encode_seconds"],
            "encode_vs_prefill": figures["encode_vs_prefill"],
            "decode_seconds": figures["decode_seconds"],
            "decode_vs_token_by_token": figures["decode_vs_token_by_token"]}


def measure(args: argparse.Namespace, write: Callable[[Report], None]) -> Report:
    model = load_default_model()
    header = start_run(model.name, f"the shipped prose sample: {args.context}-token context, "
                                   f"{args.rows}-row forwards")
    tokens = model.encode_text(shipped_text("prose"))
    context, steps = tokens[: args.context], tokens[args.context: args.context + args.steps]
    rows = tokens[: args.rows]
    paths = [*native.cpu_isas(), *(["torch"] if args.torch else [])]
    engines = {path: _engines(model, path) for path in paths}
    report = Report(header, len(context), len(rows), args.threads, 0.0,
                    [PathRow(path) for path in paths])
    with pinned_threads(args.threads):
        for row in report.paths:  # paths alternate within each measurement
            for name, engine in engines[row.path].items():
                row.step_ms[name] = _steps(engine, context, steps)
        prefills: list[float] = []
        forwards: dict[tuple[str, str], list[float]] = {}  # (path, predictor): ms per repeat
        for _ in range(args.repeats):
            for row in report.paths:
                if row.path == "torch":
                    continue
                for name, engine in engines[row.path].items():
                    forwards.setdefault((row.path, name), []).append(
                        _timed(lambda e=engine: e.forward([(e.new_sequence(), rows)])))
            prefills.append(_timed(lambda: model.prefill(rows)))
    for row in report.paths:
        row.forward_ms = {name: statistics.median(times)
                          for (path, name), times in forwards.items() if path == row.path}
    report.prefill_ms = statistics.median(prefills)
    report.header = header.finished()
    write(report)
    if not args.skip_demo:
        for row in report.paths:
            if row.path != "torch":
                row.demo = _demo(row.path)
                report.header = header.finished()
                write(report)
    return report


def render(report: Report) -> str:
    """The markdown report."""
    lines = [
        "# The integer forward on each instruction set", "",
        report.header.markdown(), "",
        f"{report.threads} threads. Every path computes the same integers (tested); only the "
        "time differs.", "",
        f"One float prefill of {report.rows} rows (the `prefill` schedule): "
        f"{report.prefill_ms:.0f} ms.", "",
        f"| path | int8 step after {report.context} tokens, min / median ms | 4-bit step | "
        f"int8 forward of {report.rows} rows, ms | 4-bit forward |", "|---|---:|---:|---:|---:|"]
    for row in report.paths:
        step = " | ".join(f"{row.step_ms[n][0]:.1f} / {row.step_ms[n][1]:.1f}"
                          if n in row.step_ms else "" for n in ("int8", "q4"))
        forward = " | ".join(f"{row.forward_ms[n]:.0f}" if n in row.forward_ms else ""
                             for n in ("int8", "q4"))
        lines.append(f"| {row.path} | {step} | {forward} |")
    demos = [row for row in report.paths if row.demo]
    if demos:
        lines += ["", "`seqkv demo` (586 tokens, `portable`, the KV given) with the path forced "
                  "by `SEQKV_INTEGER_ISA`:", "",
                  "| path | file bytes | encode s | encode / one prefill | decode s | "
                  "decode / token-by-token |", "|---|---:|---:|---:|---:|---:|"]
        for row in demos:
            d = row.demo
            lines.append(f"| {row.path} | {d['file_bytes']} | {float(d['encode_seconds']):.2f} | "
                         f"{float(d['encode_vs_prefill']):.2f}x | "
                         f"{float(d['decode_seconds']):.2f} | "
                         f"{float(d['decode_vs_token_by_token']):.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--torch", action="store_true",
                        help="also time the torch statement's one-row step (slow)")
    parser.add_argument("--markdown", type=Path, default=ROOT / "reports" / "integer_paths.md")
    args = parser.parse_args()

    def write(report: Report) -> None:
        args.markdown.write_text(render(report))

    report = measure(args, write)
    print(json.dumps(asdict(report)))


if __name__ == "__main__":
    main()

"""What ``seqkv check`` costs, against ``seqkv compress`` plus 8 float prefills, side by side.

Issue 28's target: at ``portable`` and at ``tokens``, ``seqkv check`` of a 2,000-token text costs
at most ``seqkv compress`` of the same text at the same level, verification on, plus the time of
8 float prefills of the text. This script measures the three in one run, level by level, on one
text (a committed long text cut at the last line break before ``--tokens``), and writes a
markdown report of the figures with the model, the text, the machine and its load.

    python benchmarks/check_cost.py [--tokens 2000] [--levels portable tokens]
                                    [--level-tokens LEVEL=N ...] [--text PATH]
                                    [--out DIR] [--report reports/check_cost.md]

``--level-tokens tokens=1000`` cuts the text shorter for one level (the ``tokens`` level's
token-by-token float decode is the slow part on a loaded 2-core machine); the report says so.

Invariants:
1. ``check`` and ``compress`` are the CLI, one process each, measured from their own rusage
   (``long_checks.run_measured``): each pays for loading the model once (enforced: the same
   measurement for both).
2. The prefills run in this process on the model loaded once, each over the whole text on a
   fresh cache with every position's logits, under the prefill schedule's threads: what the
   check's shared prefill runs (enforced).
3. The verdict is by CPU seconds, which another job's load changes less than wall seconds; both
   are in the report, with the load average at the start and the end of each level (checked:
   copied from the measurements, never written by hand).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from seqkv.kvcache import with_cache
from seqkv.models import load_default_model
from seqkv.models.adapter import CausalLM
from seqkv.provenance import RunHeader, start_run
from seqkv.schedule import pinned_threads, schedule_threads

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_checks import LONG_TEXTS, Run, cut_at_line_break, run_measured

PREFILLS = 8


@dataclass(frozen=True)
class Prefills:
    count: int
    wall_seconds: float
    cpu_seconds: float  # this process, all its threads


@dataclass(frozen=True)
class LevelCost:
    level: str
    tokens: int
    check: Run | None  # None: not measured (the run stopped before it finished)
    check_phase_cpu_seconds: float  # the check's own phases, without loading the model
    check_passed: bool
    compress: Run | None
    prefills: Prefills | None


@torch.inference_mode()
def time_prefills(model: CausalLM, tokens: list[int], count: int) -> Prefills:
    """``count`` float prefills over ``tokens``, each on a fresh cache with every logit row."""
    ids = torch.tensor([tokens], device=model.device)  # [1, T]
    cpu, wall = time.process_time(), time.perf_counter()
    with pinned_threads(schedule_threads("prefill")):
        for _ in range(count):
            model.model(input_ids=ids, **with_cache(model.model, DynamicCache()), use_cache=True)
    return Prefills(count, time.perf_counter() - wall, time.process_time() - cpu)


def measure_level(model: CausalLM, text: str, level: str, folder: Path) -> LevelCost:
    """The three measurements, each saved under ``folder`` as soon as it is taken."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "text.txt"
    path.write_text(text, encoding="utf-8")
    tokens = model.encode_text(text)
    prefills = time_prefills(model, tokens, PREFILLS)
    _save(folder / "prefills.json", {"tokens": len(tokens), **asdict(prefills)})
    compress = run_measured([sys.executable, "-m", "seqkv", "compress", str(path), "-o",
                             str(folder / "text.skv"), "--level", level, "--json",
                             "--progress"],
                            folder / "compress.json", folder / "compress.err")
    _save(folder / "compress.run.json", asdict(compress))
    check = run_measured([sys.executable, "-m", "seqkv", "check", str(path), "--level", level,
                          "--json", "--progress", "--report", str(folder / "check.md")],
                         folder / "check.json", folder / "check.err")
    _save(folder / "check.run.json", asdict(check))
    return saved_level(folder, level)


def _save(path: Path, data: dict[str, object]) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


def saved_level(folder: Path, level: str) -> LevelCost:
    """A level's measurements as saved under ``folder``; those not taken (yet) are None."""

    def load(name: str) -> dict[str, Any] | None:
        path = folder / name
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    prefills, compress, check = load("prefills.json"), load("compress.run.json"), load(
        "check.run.json")
    tokens = 0 if prefills is None else int(prefills.pop("tokens"))
    result: dict[str, Any] = {"passed": False, "phases": []}
    stdout = (folder / "check.json").read_text(encoding="utf-8").strip() if check else ""
    if stdout:
        result = json.loads(stdout.splitlines()[-1])
    return LevelCost(level, tokens, None if check is None else Run(**check),
                     sum(float(p["cpu_seconds"]) for p in result["phases"]),
                     bool(result["passed"]), None if compress is None else Run(**compress),
                     None if prefills is None else Prefills(**prefills))


def render(costs: list[LevelCost], header: RunHeader, notes: tuple[str, ...] = ()) -> str:
    lines = [
        "# `seqkv check` against `seqkv compress` plus 8 float prefills",
        "",
        header.markdown(),
        "",
        "The text is cut at the last line break before the token count. The 1-minute load "
        "average at each level's start and end is in its row: other jobs change the wall "
        "time more than the CPU seconds. "
        "`check` and `compress` are one CLI process each (each loads the model once); "
        "`compress` verifies (a full decode); the prefills run in the measuring process on "
        "the model already loaded. CPU seconds are user + system of the process, all threads.",
        "",
        "| level | tokens | check CPU (s) | check phases CPU (s) | compress CPU (s) | 8 prefills "
        "CPU (s) | check / (compress + 8 prefills), CPU | target met (CPU) | check wall (s) | "
        "compress wall (s) | 8 prefills wall (s) | check / (compress + 8 prefills), wall | "
        "check verdict | check peak RSS (MiB) | load (start / end) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for c in costs:
        lines.append(_row(c))
    for note in notes:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _row(c: LevelCost) -> str:
    missing = "did not finish"
    check_cpu = missing if c.check is None else f"{c.check.cpu_seconds:,.1f}"
    check_wall = missing if c.check is None else f"{c.check.wall_seconds:,.1f}"
    phases = "" if c.check is None else f"{c.check_phase_cpu_seconds:,.1f}"
    compress_cpu = missing if c.compress is None else f"{c.compress.cpu_seconds:,.1f}"
    compress_wall = missing if c.compress is None else f"{c.compress.wall_seconds:,.1f}"
    prefill_cpu = missing if c.prefills is None else f"{c.prefills.cpu_seconds:,.1f}"
    prefill_wall = missing if c.prefills is None else f"{c.prefills.wall_seconds:,.1f}"
    cpu_ratio = wall_ratio = met = verdict = rss = ""
    if c.check is not None and c.compress is not None and c.prefills is not None:
        cpu = c.check.cpu_seconds / (c.compress.cpu_seconds + c.prefills.cpu_seconds)
        wall = c.check.wall_seconds / (c.compress.wall_seconds + c.prefills.wall_seconds)
        cpu_ratio, wall_ratio, met = f"{cpu:.2f}", f"{wall:.2f}", "yes" if cpu <= 1 else "no"
    if c.check is not None:
        verdict = "PASS" if c.check_passed else f"FAIL (exit {c.check.exit_code})"
        rss = f"{c.check.max_rss_mib:,.0f}"
    runs = [r for r in (c.compress, c.check) if r is not None]
    load = "" if not runs else f"{runs[0].load_before:.1f} / {runs[-1].load_after:.1f}"
    return (f"| {c.level} | {c.tokens:,} | {check_cpu} | {phases} | {compress_cpu} | "
            f"{prefill_cpu} | {cpu_ratio} | {met} | {check_wall} | {compress_wall} | "
            f"{prefill_wall} | {wall_ratio} | {verdict} | {rss} | {load} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--levels", nargs="+", default=["portable", "tokens"])
    parser.add_argument("--level-tokens", action="append", default=[], metavar="LEVEL=N")
    parser.add_argument("--text", type=Path, default=LONG_TEXTS / "prose.txt")
    parser.add_argument("--out", type=Path, default=Path("/tmp/seqkv-check-cost"))
    parser.add_argument("--report", default="reports/check_cost.md")
    parser.add_argument("--render-only", action="store_true",
                        help="rebuild the report from what a run left under --out")
    parser.add_argument("--note", action="append", default=[],
                        help="with --render-only: a paragraph to add (what did not finish)")
    args = parser.parse_args()
    limits = {level: args.tokens for level in args.levels}
    for item in args.level_tokens:
        level, _, count = item.partition("=")
        limits[level] = int(count)
    command = " ".join(["python benchmarks/check_cost.py", *sys.argv[1:]])
    model_name = "SmolLM2-135M-Instruct (the embedded model)"
    data = f"`{_repo_relative(args.text)}`, cut at the level's token count"
    if args.render_only:
        costs = [saved_level(args.out / level, level) for level in args.levels
                 if (args.out / level / "prefills.json").exists()]
        # NOTE: these facts are the rendering run's, not the measuring run's: the data line
        # says so, and each row keeps the load its measurement saw.
        header = start_run(model_name, f"{data}; rendered from the measurements saved under "
                                       f"`{args.out}`", command).finished()
        Path(args.report).write_text(render(costs, header, tuple(args.note)), encoding="utf-8")
        return
    model = load_default_model()
    header = start_run(model.name, data, command)
    source = args.text.read_text(encoding="utf-8")
    costs: list[LevelCost] = []
    for level in args.levels:
        text = cut_at_line_break(source, limits[level],
                                 lambda piece: len(model.encode_text(piece)))
        costs.append(measure_level(model, text, level, args.out / level))
        print(_row(costs[-1]), flush=True)
        Path(args.report).write_text(render(costs, header.finished()), encoding="utf-8")


def _repo_relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path(__file__).resolve().parent.parent))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    main()

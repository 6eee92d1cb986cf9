"""``seqkv check`` on long texts of each kind (prose, code, legal, technical), a report of all.

The shipped texts are 215-586 tokens; users store sessions of thousands, and the model's context
is 8,192. This script cuts each committed long text (``benchmarks/texts/long/``, at least 8,192
tokens each, sources and licences in its ``LICENSES.md``) at ``--tokens``, runs the ``seqkv
check`` command on it at ``--level`` (the CLI, as a user would, one process per text), and
writes one markdown report of the verdicts, Theorem 1's exact gap, Lemma 1's gate, the wall
time, the CPU seconds of each phase and the peak memory of each check.

    python benchmarks/long_checks.py [--tokens 2000] [--level portable] [--out DIR]
                                     [--report reports/long_checks.md] [--kinds KIND ...]
                                     [--text KIND=PATH ...] [--render-only]

Each run leaves its files under ``--out``/``tokens-N`` (each text as cut, its check's JSON, and
``KIND.run.json`` with the exit code, wall and CPU seconds, peak memory and load average); the
report is rebuilt from every ``tokens-N`` folder under ``--out``, so a run at 2,000 tokens and
one at 8,192 tokens into the same ``--out`` give one report of both. ``--render-only`` rebuilds
it without running anything.

Each text is cut at the last line break before ``--tokens`` tokens (of the embedded model's
tokenizer), so every check sees whole lines. ``--text KIND=PATH`` replaces one.

Invariants:
1. Each text's source, sha256 and token count are in the report (checked: the report's rows are
   built from the files written under ``--out``, which are what the checks read).
2. Verdicts and figures are copied from each check's ``--json`` output, never written here;
   a check that exits non-zero is a FAIL row, not an exception (enforced).
3. Peak memory and CPU seconds are the check process's own (``os.wait4`` on it), not this
   script's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seqkv.models import load_default_model
from seqkv.provenance import RunHeader, start_run

HERE = Path(__file__).resolve().parent
LONG_TEXTS = HERE / "texts" / "long"
KINDS = ("prose", "code", "legal", "technical")


def cut_at_line_break(text: str, limit: int, count: Callable[[str], int]) -> str:
    """The longest run of whole lines from the start whose token count is at most ``limit``."""
    lines = text.splitlines(keepends=True)
    low, high = 1, len(lines)
    while low < high:  # the token count grows with the number of lines
        middle = (low + high + 1) // 2
        if count("".join(lines[:middle])) <= limit:
            low = middle
        else:
            high = middle - 1
    return "".join(lines[:low])


@dataclass(frozen=True)
class Run:
    """One check process, as ``os.wait4`` saw it."""

    exit_code: int
    wall_seconds: float
    cpu_seconds: float  # user + system of the check process
    max_rss_mib: float
    load_before: float  # 1-minute load average when it started
    load_after: float


def run_measured(command: list[str], stdout: Path, stderr: Path) -> Run:
    """Run ``command`` with its output in files, and measure it from its own rusage."""
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    return Run(process.returncode, time.perf_counter() - started,
               usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,  # KiB on Linux
               load_before, os.getloadavg()[0])


@dataclass(frozen=True)
class Row:
    kind: str
    source: str
    sha256: str
    tokens: int
    run: Run
    result: dict[str, Any] | None  # the check's --json output


def _theorem1(result: dict[str, Any]) -> str:
    theorem1 = result.get("theorem1")
    if not theorem1:
        return "n/a"
    return (f"{theorem1['positions']:,} positions: sum {theorem1['gap_bits']:.3e}, mean "
            f"{theorem1['mean_gap_bits']:.3e}, max {theorem1['max_gap_bits']:.3e}")


def _lemma1(result: dict[str, Any]) -> str:
    lemma1 = result["lemma1"]
    integer = lemma1["integer"]
    same = sum(1 for pair in integer if pair["identical"])
    digest = "restored" if lemma1["digest_restored"] else "NOT restored"
    return f"integer {same} of {len(integer)} pairs identical; float digest {digest}"


def _rows_table(rows: list[Row]) -> list[str]:
    lines = [
        "| kind | source | tokens | verdict | bounds holding | Theorem 1 gap H(t) - H(KV) "
        "(bits, exact) | Lemma 1 gate | code bits/token | cross-entropy bits/token | wall (s) "
        "| CPU (s) | peak RSS (MiB) | load (1 min, start/end) |",
        "|---|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        run = row.run
        tail = (f"{run.wall_seconds:,.0f} | {run.cpu_seconds:,.0f} | {run.max_rss_mib:,.0f} | "
                f"{run.load_before:.1f} / {run.load_after:.1f} |")
        if row.result is None:
            lines.append(f"| {row.kind} | {row.source} | {row.tokens:,} | FAIL (exit "
                         f"{run.exit_code}, no JSON) | | | | | | {tail}")
            continue
        result = row.result
        bounds = [c for c in result["checks"] if c["kind"] == "bound"]
        held = sum(1 for c in bounds if c["holds"])
        failed = [c["name"] for c in bounds if not c["holds"]]
        verdict = "PASS" if result["passed"] else f"FAIL ({', '.join(failed)})"
        lines.append(
            f"| {row.kind} | {row.source} | {row.tokens:,} | {verdict} (exit {run.exit_code}) "
            f"| {held} of {len(bounds)} | {_theorem1(result)} | {_lemma1(result)} | "
            f"{float(result['code_bits']) / row.tokens:.4f} | "
            f"{float(result['cross_entropy_bits']) / row.tokens:.4f} | {tail}")
    return lines


def _phases_table(rows: list[Row]) -> list[str]:
    done = [row for row in rows if row.result is not None]
    if not done:
        return []
    names: list[str] = []
    for row in done:
        assert row.result is not None
        names += [p["name"] for p in row.result["phases"] if p["name"] not in names]
    lines = ["CPU seconds per phase (the check process, all its threads; wall seconds in "
             "brackets):", "",
             "| phase | " + " | ".join(row.kind for row in done) + " |",
             "|---|" + "---:|" * len(done)]
    for name in names:
        cells = []
        for row in done:
            assert row.result is not None
            phase = next((p for p in row.result["phases"] if p["name"] == name), None)
            cells.append("" if phase is None else
                         f"{phase['cpu_seconds']:,.1f} ({phase['wall_seconds']:,.1f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    budgets = [phase_budget(row.result) for row in done if row.result is not None]
    lines.append("| **all phases** | " + " | ".join(
        f"**{b.check_cpu_seconds:,.1f}**" for b in budgets) + " |")
    lines.append("| compress + decode and verify + 9 x shared prefill (compress's own and 8 "
                 "more: issue 28's budget, from these phases) | " + " | ".join(
                     f"{b.budget_cpu_seconds:,.1f}" for b in budgets) + " |")
    lines.append("| all phases / budget | " + " | ".join(
        f"{b.check_cpu_seconds / b.budget_cpu_seconds:.2f}" for b in budgets) + " |")
    return lines


@dataclass(frozen=True)
class PhaseBudget:
    """Issue 28's target read from one check's own phases: the check's CPU seconds against
    what ``seqkv compress`` with verification costs (its prefill, its encode, its decode: the
    check's shared prefill, compress and decode-and-verify phases) plus 8 more float
    prefills (8 x the shared prefill phase, which also runs the start token's row)."""

    check_cpu_seconds: float
    budget_cpu_seconds: float


def phase_budget(result: dict[str, Any]) -> PhaseBudget:
    cpu = {p["name"]: float(p["cpu_seconds"]) for p in result["phases"]}
    prefill = cpu.get("shared prefill", 0.0)
    return PhaseBudget(sum(cpu.values()), cpu.get("compress", 0.0)
                       + cpu.get("decode and verify", 0.0) + 9 * prefill)


def render(header: RunHeader, sections: dict[int, tuple[list[str], list[Row]]],
           notes: tuple[str, ...] = ()) -> str:
    """The report: the run's header, one section per token count, each with the commands that
    made it, then ``notes`` (what did not finish, say) as paragraphs."""
    lines = [
        "# `seqkv check` on long texts of each kind",
        "",
        header.markdown(),
        "",
        "The load average at each check's start and end is in its row "
        "(other jobs change the wall time more than the CPU seconds). Check defaults: `--seed "
        "0`, 16 entropy-rate contexts of 2 continuations of 32 tokens; Lemma 1 on the whole "
        "text for the schedules the file meets (the integer predictor's encoder against its "
        "decoder, by digest; the float model's prefill repeated and chunks of 64), the other "
        "schedules on windows (token steps on 32 positions; the integer chunks of 17 and 64, "
        "batch of 2 and other thread count, and the float batch of 2 and 1 thread, on the first "
        "256); tolerance 1e-4. The texts are "
        "`benchmarks/texts/long/` (sources and licences in its `LICENSES.md`), each cut at the "
        "last line break before the token count.",
    ]
    for tokens, (commands, rows) in sorted(sections.items()):
        lines += ["", f"## {tokens:,} tokens", ""]
        if commands:
            lines += ["Commands: " + "; ".join(f"`{command}`" for command in commands), ""]
        if not rows:
            lines += ["No check finished at this token count (see the notes below)."]
            continue
        lines += _rows_table(rows)
        lines += ["", *_phases_table(rows)]
        lines += ["", "Texts (sha256 of the file each check read):", ""]
        lines += [f"- {r.kind}: `{r.sha256}`" for r in rows]
    for note in notes:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _saved_rows(folder: Path, kinds: tuple[str, ...]) -> tuple[list[str], list[Row]]:
    """The commands and the rows of a run, from the files it left in ``folder``."""
    rows = []
    commands: list[str] = []
    for kind in kinds:
        run_file = folder / f"{kind}.run.json"
        if not run_file.exists():
            continue
        saved = json.loads(run_file.read_text(encoding="utf-8"))
        commands += [saved["command"]] if saved["command"] not in commands else []
        stdout = (folder / f"check-{kind}.json").read_text(encoding="utf-8").strip()
        result = json.loads(stdout.splitlines()[-1]) if stdout else None
        text = (folder / f"{kind}.txt").read_bytes()
        rows.append(Row(kind, saved["source"], hashlib.sha256(text).hexdigest(),
                        saved["tokens"], Run(**saved["run"]), result))
    return commands, rows


def _all_sections(out: Path, kinds: tuple[str, ...]
                  ) -> dict[int, tuple[list[str], list[Row]]]:
    return {int(folder.name.removeprefix("tokens-")): _saved_rows(folder, kinds)
            for folder in sorted(out.glob("tokens-*"))}


def _repo_relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(HERE.parent))
    except ValueError:
        return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--level", default="portable")
    parser.add_argument("--out", default="/tmp/seqkv-long-checks")
    parser.add_argument("--report", default="reports/long_checks.md")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS))
    parser.add_argument("--text", action="append", default=[], metavar="KIND=PATH")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--note", action="append", default=[],
                        help="with --render-only: a paragraph to add (what did not finish)")
    args = parser.parse_args()
    out = Path(args.out)
    command = " ".join(["python benchmarks/long_checks.py", *sys.argv[1:]])
    data = "`benchmarks/texts/long/`, each text cut at its section's token count"
    if args.render_only:
        # NOTE: these facts are the rendering run's: the data line says so, and each row keeps
        # the load its check saw and each section the commands that measured it.
        header = start_run("SmolLM2-135M-Instruct (the embedded model)",
                           f"{data}; rendered from the runs saved under `{out}`", command)
        Path(args.report).write_text(render(header.finished(), _all_sections(out, KINDS),
                                            tuple(args.note)), encoding="utf-8")
        return
    sources = {kind: LONG_TEXTS / f"{kind}.txt" for kind in KINDS}
    for item in args.text:
        kind, _, path = item.partition("=")
        sources[kind] = Path(path)
    for kind in args.kinds:
        if not sources[kind].is_file():
            raise SystemExit(f"long_checks: {sources[kind]} does not exist: give the {kind} "
                             "text with --text KIND=PATH")
    folder = out / f"tokens-{args.tokens}"
    folder.mkdir(parents=True, exist_ok=True)
    model = load_default_model()
    header = start_run(model.name, data, command)

    def count(text: str) -> int:
        return len(model.encode_text(text))

    for kind in args.kinds:
        text = cut_at_line_break(sources[kind].read_text(encoding="utf-8"), args.tokens, count)
        path = folder / f"{kind}.txt"
        path.write_text(text, encoding="utf-8")
        tokens = count(text)
        run = run_measured([sys.executable, "-m", "seqkv", "check", str(path), "--json",
                            "--progress", "--level", args.level,
                            "--report", str(folder / f"check-{kind}.md")],
                           folder / f"check-{kind}.json", folder / f"check-{kind}.err")
        (folder / f"{kind}.run.json").write_text(json.dumps(
            {"command": command, "source": _repo_relative(sources[kind]), "tokens": tokens,
             "run": asdict(run)}), encoding="utf-8")
        print(f"{kind}: {tokens} tokens, exit {run.exit_code}, {run.wall_seconds:.0f} s wall, "
              f"{run.cpu_seconds:.0f} s CPU, {run.max_rss_mib:.0f} MiB", flush=True)
        Path(args.report).write_text(render(header.finished(), _all_sections(out, KINDS)),
                                     encoding="utf-8")


if __name__ == "__main__":
    main()

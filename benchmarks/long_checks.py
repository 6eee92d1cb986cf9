"""``seqkv check`` on long texts of each kind (prose, code, legal, technical), a report of all four.

The shipped texts are 215-586 tokens; users store sessions of thousands. This script assembles a
text of each kind a few thousand tokens long, runs the ``seqkv check`` command on each (the CLI,
as a user would, one process per text), and writes one markdown table of the verdicts, the bounds
and the measured H(KV | prefix) - H(t | prefix) gap with its interval.

    python benchmarks/long_checks.py [--tokens 2048] [--out DIR] [--report reports/long_checks.md]
                                     [--text KIND=PATH ...] [--render-only]

``--render-only`` rebuilds the report from what a run left under ``--out`` (each text, its
check's JSON and ``KIND.run.json`` with the exit code and seconds), without running anything.

The texts (none is copied into the project; each is read where it lives):
- prose: ``benchmarks/texts/prose-long.txt``, written for this project (a history of a canal);
- code: the source of Python's standard ``textwrap`` module, from the running interpreter;
- legal: the Apache License 2.0 as Debian ships it, ``/usr/share/common-licenses/Apache-2.0``;
- technical: Python's own reference documentation, the topics of ``pydoc_data.topics`` in
  sorted order (what ``help("with")`` prints).
Each is cut at the last line break before ``--tokens`` tokens, so every check sees whole lines.
``--text KIND=PATH`` replaces one (for a machine without the Debian file, say).

Invariants:
1. Each text's source, sha256 and token count are in the report (checked: the report's rows are
   built from the files written under ``--out``, which are what the checks read).
2. Verdicts and figures are copied from each check's ``--json`` output, never written here;
   a check that exits non-zero is a FAIL row, not an exception (enforced).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from seqkv.models import load_default_model

HERE = Path(__file__).resolve().parent
APACHE = Path("/usr/share/common-licenses/Apache-2.0")


def _python_reference_topics() -> str:
    from pydoc_data.topics import topics  # type: ignore[import-not-found,unused-ignore]

    return "\n\n".join(str(topics[name]) for name in sorted(topics))


def _sources() -> dict[str, tuple[str, str]]:
    """kind -> (where it comes from, loader name); loaded lazily in ``_load``."""
    return {
        "prose": (str(HERE / "texts" / "prose-long.txt"), "file"),
        "code": (f"Python {platform.python_version()} textwrap.py", "textwrap"),
        "legal": (str(APACHE), "file"),
        "technical": (f"Python {platform.python_version()} pydoc_data.topics", "topics"),
    }


def _load(source: str, loader: str) -> str:
    if loader == "textwrap":
        return inspect.getsource(textwrap)
    if loader == "topics":
        return _python_reference_topics()
    if not Path(source).is_file():
        raise SystemExit(f"long_checks: {source} does not exist here: give the text with "
                         "--text KIND=PATH")
    return Path(source).read_text(encoding="utf-8")


def _cut(text: str, limit: int, count: Callable[[str], int]) -> str:
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
class Row:
    kind: str
    source: str
    sha256: str
    tokens: int
    exit_code: int
    seconds: float
    result: dict[str, Any] | None  # the check's --json output
    stderr_tail: str


def _kv_check(result: dict[str, Any]) -> dict[str, Any]:
    for check in result["checks"]:
        if "kv" in check["name"] and "entropy" in check["name"] and check["kind"] == "bound":
            return dict(check)
    raise KeyError("the check output has no kv entropy bound")


def render(rows: list[Row], command: str, note: str = "") -> str:
    lines = [
        "# `seqkv check` on long texts of each kind",
        "",
        f"Model: the embedded SmolLM2-135M-Instruct. Machine: {os.cpu_count()} CPU cores "
        f"({platform.machine()}, {torch.backends.cpu.get_cpu_capability()}), torch "
        f"{torch.__version__}; shared with other jobs while these ran, so the times are of a "
        "loaded machine. Check defaults: `--seed 0`, 32 KV positions (top 32 tokens each), 16 "
        "entropy contexts, tolerance 1e-4.",
        "",
        f"Command: `{command}`{note}",
        "",
        "| kind | source | tokens | verdict | bounds holding | H(t) - H(KV) gap, mean (bits) "
        "| 95% interval | code bits/token | cross-entropy bits/token | time (s) |",
        "|---|---|---:|---|---|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        row = replace(row, source=row.source.replace(f"{HERE.parent}/", ""))  # repo-relative
        if row.result is None:
            lines.append(f"| {row.kind} | {row.source} | {row.tokens:,} | FAIL (exit "
                         f"{row.exit_code}, no JSON) | | | | | | {row.seconds:,.0f} |")
            continue
        result = row.result
        bounds = [c for c in result["checks"] if c["kind"] == "bound"]
        held = sum(1 for c in bounds if c["holds"])
        failed = [c["name"] for c in bounds if not c["holds"]]
        kv = _kv_check(result)
        interval = kv["interval"]
        span = "n/a" if not isinstance(interval, dict) else (
            f"[{interval['low']:.3e}, {interval['high']:.3e}]")
        verdict = "PASS" if result["passed"] else f"FAIL ({', '.join(failed)})"
        code_bits = float(result["code_bits"])
        lines.append(
            f"| {row.kind} | {row.source} | {row.tokens:,} | {verdict} (exit {row.exit_code}) | "
            f"{held} of {len(bounds)} | {float(kv['measured']):.3e} | {span} | "
            f"{code_bits / row.tokens:.4f} | "
            f"{float(result['cross_entropy_bits']) / row.tokens:.4f} | "
            f"{row.seconds:,.0f} |")
    lines += ["", "Texts (sha256 of the file each check read):", ""]
    lines += [f"- {r.kind}: `{r.sha256}`" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--out", default="/tmp/seqkv-long-checks")
    parser.add_argument("--report", default="reports/long_checks.md")
    parser.add_argument("--kinds", nargs="+", default=["prose", "code", "legal", "technical"])
    parser.add_argument("--text", action="append", default=[], metavar="KIND=PATH")
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    command = " ".join(["python benchmarks/long_checks.py", *sys.argv[1:]])
    if args.render_only:
        command = f"python benchmarks/long_checks.py --tokens {args.tokens} --out {args.out}"
        rebuilt = " (this report rebuilt from that run's files with `--render-only`)"
        Path(args.report).write_text(
            render(_saved_rows(Path(args.out), args.kinds), command, rebuilt), encoding="utf-8")
        return
    sources = _sources()
    for item in args.text:
        kind, _, path = item.partition("=")
        sources[kind] = (path, "file")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_default_model()

    def count(text: str) -> int:
        return len(model.encode_text(text))

    seqkv = Path(sys.executable).with_name("seqkv")
    rows: list[Row] = []
    for kind in args.kinds:
        source, loader = sources[kind]
        text = _cut(_load(source, loader), args.tokens, count)
        path = out / f"{kind}.txt"
        path.write_text(text, encoding="utf-8")
        tokens = count(text)
        started = time.perf_counter()
        done = subprocess.run([str(seqkv), "check", str(path), "--json", "--report",
                               str(out / f"check-{kind}.md")],
                              capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        result = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
        rows.append(Row(kind, source, hashlib.sha256(path.read_bytes()).hexdigest(), tokens,
                        done.returncode, seconds, result, done.stderr[-2000:]))
        (out / f"check-{kind}.json").write_text(done.stdout, encoding="utf-8")
        (out / f"{kind}.run.json").write_text(json.dumps(
            {"source": source, "tokens": tokens, "exit_code": done.returncode,
             "seconds": seconds}), encoding="utf-8")
        print(f"{kind}: {tokens} tokens, exit {done.returncode}, {seconds:.0f} s", flush=True)
        Path(args.report).write_text(render(rows, command), encoding="utf-8")


def _saved_rows(out: Path, kinds: list[str]) -> list[Row]:
    """The rows of a finished run, from the files it left under ``out``."""
    rows = []
    for kind in kinds:
        run_file = out / f"{kind}.run.json"
        if not run_file.exists():
            continue
        run = json.loads(run_file.read_text(encoding="utf-8"))
        stdout = (out / f"check-{kind}.json").read_text(encoding="utf-8").strip()
        result = json.loads(stdout.splitlines()[-1]) if stdout else None
        text = (out / f"{kind}.txt").read_bytes()
        rows.append(Row(kind, run["source"], hashlib.sha256(text).hexdigest(), run["tokens"],
                        run["exit_code"], run["seconds"], result, ""))
    return rows


if __name__ == "__main__":
    main()

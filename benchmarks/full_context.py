"""Every operation at the model's full context: one text of ~8,192 tokens, each level, each verb.

The long prose text (``benchmarks/texts/long/prose.txt``, its source and licence in that folder's
``LICENSES.md``) is cut at the last line break before ``--tokens`` tokens (default 8,192, the
embedded model's context; ``long_checks.cut_at_line_break``). Then, each as its own ``seqkv``
process (the CLI, as a user runs it; its peak resident memory and CPU seconds from ``os.wait4``):

* at ``portable``, ``portable+mix``, ``portable4``, ``ngram`` and ``plain``: ``compress
  --no-verify``, ``decompress`` (text and KV to files), ``store put`` into a fresh directory
  store, ``store get`` (text and KV) from a fresh process, and ``check``;
* at ``tokens``, ``rows`` and ``segments:16``: ``compress --no-verify`` and ``decompress``.

``portable+mix`` codes with a dictionary built (``seqkv dict build``) from the four shipped
texts, never from the text measured; the store gets it by ``store dict-put``. Every wall time
includes the process's model load (``--load-only`` measures that alone, so it can be subtracted).
Operations run in the order given (cheap ones first), and the report is rewritten after each,
so what finished is kept when a run is stopped. ``--skip LEVEL:VERB`` leaves one out (say, a
check measured elsewhere).

Usage: ``PYTHONPATH=src python benchmarks/full_context.py [--tokens 8192] [--out DIR]
[--markdown reports/full_context.md] [--skip portable:check] [--levels L ...] [--resume]
[--render-only]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from long_checks import LONG_TEXTS, Run, cut_at_line_break, run_measured

from seqkv import provenance
from seqkv.bench.texts import TEXT_FILES
from seqkv.models import load_default_model

EVERY_VERB = ("compress", "decompress", "store put", "store get", "check")
PLAN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plain", EVERY_VERB), ("ngram", EVERY_VERB), ("portable", EVERY_VERB),
    ("portable4", EVERY_VERB), ("portable+mix", EVERY_VERB),
    ("segments:16", ("compress", "decompress")), ("rows", ("compress", "decompress")),
    ("tokens", ("compress", "decompress")),
)


@dataclass(frozen=True)
class Operation:
    level: str
    verb: str
    run: Run
    output: str  # the last lines of stderr when it failed; else a figure from its --json
    commit: str = ""  # the code it ran (``_commit``)

    @property
    def ok(self) -> bool:
        return self.run.exit_code == 0


def _seqkv() -> list[str]:
    return [sys.executable, "-m", "seqkv"]


def _safe(level: str) -> str:
    return level.replace(":", "-").replace("+", "-")


def command(level: str, verb: str, text: Path, work: Path, dictionary: Path) -> list[str]:
    """The CLI line of one operation (``--json`` where the verb has it)."""
    name = _safe(level)
    skv, store = work / f"{name}.skv", f"dir:{work / f'store-{name}'}"
    mix = ["--dict", str(dictionary)] if level == "portable+mix" else []
    if verb == "compress":
        return [*_seqkv(), "compress", str(text), "-o", str(skv), "--level", level,
                "--no-verify", "--json", *mix]
    if verb == "decompress":
        return [*_seqkv(), "decompress", str(skv), "-o", str(work / f"{name}.txt"),
                "--kv-out", str(work / f"{name}.kv.safetensors"), "--json", *mix]
    if verb == "store put":
        return [*_seqkv(), "store", "put", "s", str(text), "--level", level, "--store", store,
                "--json"]
    if verb == "store get":
        return [*_seqkv(), "store", "get", "s", "-o", str(work / f"{name}.get.txt"),
                "--kv-out", str(work / f"{name}.get.kv.safetensors"), "--store", store,
                "--json"]
    if verb == "check":
        # the text at the level, as ``long_checks`` runs it (the check codes it itself)
        return [*_seqkv(), "check", str(text), "--level", level, "--report",
                str(work / f"{name}.check.md"), "--json"]
    raise ValueError(verb)


def _figure(verb: str, stdout: str) -> str:
    """One figure from an operation's JSON output, for the report."""
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError:
        return ""
    if not isinstance(data, dict):
        return ""
    if verb == "check":
        return f"check {'PASS' if data.get('passed') else 'FAIL'}"
    for key in ("file_bytes", "bytes", "record_bytes", "tokens"):
        if key in data:
            return f"{key} {data[key]:,}" if isinstance(data[key], int) else ""
    return ""


def _measure(level: str, verb: str, line: list[str], work: Path) -> Operation:
    name = f"{_safe(level)}.{verb.replace(' ', '-')}"
    out, err = work / f"{name}.out", work / f"{name}.err"
    run = run_measured(line, out, err)
    if run.exit_code != 0:
        tail = err.read_text("utf-8", "replace").strip().splitlines()[-3:]
        return Operation(level, verb, run, " / ".join(tail), _commit())
    return Operation(level, verb, run, _figure(verb, out.read_text("utf-8", "replace")),
                     _commit())


def render(operations: list[Operation], header: list[str]) -> str:
    lines = [*header, "",
             "| level | operation | exit | wall (s) | CPU (s) | peak RSS (MiB) | load (1 min, "
             "start/end) | output | commit |",
             "|---|---|---:|---:|---:|---:|---|---|---|"]
    for op in operations:
        r = op.run
        lines.append(f"| {op.level} | {op.verb} | {r.exit_code} | {r.wall_seconds:,.1f} | "
                     f"{r.cpu_seconds:,.1f} | {r.max_rss_mib:,.0f} | {r.load_before:.1f} / "
                     f"{r.load_after:.1f} | {op.output.replace('|', '/')} | {op.commit} |")
    total = sum(op.run.wall_seconds for op in operations)
    lines += ["", f"All operations: {total / 60:,.1f} minutes of wall time."]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    """The checkout's commit (``+dirty`` when tracked files changed), for each row."""
    return provenance.commit(LONG_TEXTS.parent)


def _plan(levels: list[str] | None, skip: list[str]) -> list[tuple[str, str]]:
    """(level, verb) pairs: ``PLAN``'s, or its levels in the order ``levels`` names them."""
    verbs = dict(PLAN)
    order = levels or [level for level, _ in PLAN]
    return [(level, verb) for level in order for verb in verbs[level]
            if f"{level}:{verb}" not in skip]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--out", type=Path, default=Path("full-context-run"))
    parser.add_argument("--markdown", type=Path, default=Path("reports/full_context.md"))
    parser.add_argument("--skip", nargs="*", default=[], metavar="LEVEL:VERB")
    parser.add_argument("--levels", nargs="*", default=None,
                        help="only these levels, in this order")
    parser.add_argument("--resume", action="store_true",
                        help="keep --out's finished operations and run only the others")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite --markdown from --out's finished operations, run nothing")
    args = parser.parse_args()
    model = load_default_model()
    work = args.out / f"tokens-{args.tokens}"
    if not (args.resume or args.render_only):
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    source = LONG_TEXTS / "prose.txt"
    text = cut_at_line_break(source.read_text("utf-8"), args.tokens,
                             lambda t: len(model.encode_text(t)))
    tokens = len(model.encode_text(text))
    text_path = work / "prose.txt"
    text_path.write_text(text, "utf-8")
    dictionary = work / "shipped.dict"
    shipped = [str(importlib.resources.files("seqkv") / "data" / f)
               for f in TEXT_FILES.values()]
    # NOTE: rows stream into the report, each with its own load and commit; the header's load
    # is the start's.
    run = provenance.start_run(
        f"{model.name} (context 8,192)", f"`{source.relative_to(LONG_TEXTS.parent.parent)}`, "
        f"{tokens:,} tokens", f"python benchmarks/full_context.py --tokens {args.tokens}")
    header = [
        "# Every operation at the model's full context",
        "",
        run.markdown(),
        "",
        "The 1-minute load average at each operation's start and end is in its row. Text: "
        f"`{source.relative_to(LONG_TEXTS.parent.parent)}` cut "
        f"at a line break, {tokens:,} tokens, {len(text.encode()):,} bytes, sha256 "
        f"{hashlib.sha256(text.encode()).hexdigest()[:16]}. Each operation is one `seqkv` "
        "process (wall time includes its model load: see the `load model` row of its commit); "
        "peak RSS and CPU seconds are that process's own (`os.wait4`); `commit` is the code it "
        "ran (rows "
        "of runs resumed with `--resume`, each with its `--levels`, keep their own). "
        "`portable+mix` uses a dictionary built from the four shipped texts.",
    ]
    journal = work / "operations.jsonl"
    operations = [_operation(json.loads(line)) for line in journal.read_text().splitlines()
                  ] if (args.resume or args.render_only) and journal.exists() else []
    done = {(op.level, op.verb) for op in operations if op.ok}
    operations = [op for op in operations if op.ok]

    def record(operation: Operation) -> None:
        operations.append(operation)
        with journal.open("a") as out:  # a fresh run starts in an emptied folder
            out.write(json.dumps(asdict(operation)) + "\n")
        args.markdown.write_text(render(operations, header))
        print(json.dumps(asdict(operation)), flush=True)

    if args.render_only:
        args.markdown.write_text(render(operations, header))
        return
    if not dictionary.exists():
        build = [*_seqkv(), "dict", "build", "-o", str(dictionary), "--namespace", "default",
                 *shipped]
        if run_measured(build, work / "dict.out", work / "dict.err").exit_code != 0:
            raise SystemExit((work / "dict.err").read_text())
    commit = _commit()
    if not any(op.verb == "load model" and op.commit == commit for op in operations):
        # once per checkout: the load is in every row's wall time, and it changed (the GGUF
        # parse, 27 s, then the converted copy of ``seqkv.models.gguf_cache``)
        load = [sys.executable, "-c", "from seqkv.models import load_default_model as m; m()"]
        record(Operation("-", "load model", run_measured(load, work / "load.out",
                                                         work / "load.err"),
                         "the model load alone", commit))
    for level, verb in _plan(args.levels, args.skip):
        if (level, verb) in done:
            continue
        if level == "portable+mix" and verb == "store put":
            store = f"dir:{work / f'store-{_safe(level)}'}"
            run_measured([*_seqkv(), "store", "dict-put", str(dictionary), "--store", store],
                         work / "dict-put.out", work / "dict-put.err")
        record(_measure(level, verb, command(level, verb, text_path, work, dictionary), work))


def _operation(row: dict[str, Any]) -> Operation:
    return Operation(row["level"], row["verb"], Run(**row["run"]), row["output"],
                     row.get("commit", ""))


if __name__ == "__main__":
    main()

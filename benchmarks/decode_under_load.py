"""The portable level's decode on a quiet machine and beside competing CPU-bound processes, per
thread policy of the integer forward (``seqkv.models.integer.threads``).

One session per shipped text kind is coded at ``--level`` (the first ``--tokens`` tokens, the
tokens alone), then decoded under three policies: two threads, one thread, and ``adaptive``
(the default: each decode measures its own steps and runs the faster count). Each decode runs
quiet and with ``--competitors`` processes spinning a Python loop (one per busy core, started
before and stopped after each decode), conditions and policies interleaved within each of
``--repeats`` rounds, so all meet the same background. Two figures per run: the tokens decode
(``decompress_tokens``: what the policy changes) and the whole restore (``decompress``: the
tokens, then the KV by one float prefill, which runs on the profile's fixed thread count: a
float reduction's bits depend on it). Every decode is checked to return the coded tokens.

Writes ``--markdown`` (default ``reports/decode_under_load.md``), replaces the section between
the markers in ``reports/decode_levels.md`` (``--levels-report``), prints the JSON.

Usage: ``PYTHONPATH=src python benchmarks/decode_under_load.py [--tokens 200] [--repeats 3]
[--competitors 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from seqkv.bench.texts import TEXT_FILES, shipped_text
from seqkv.errors import DecodeVerificationError
from seqkv.models import CausalLM, load_default_model
from seqkv.models.integer.threads import THREADS_ENV
from seqkv.provenance import RunHeader, start_run
from seqkv.skv import compress, decompress, decompress_tokens

POLICIES = ("2", "1", "adaptive")
CONDITIONS = ("quiet", "loaded")
TARGET = 1.5  # loaded at most 1.5x the quiet decode time
BEGIN, END = "<!-- decode-under-load -->", "<!-- /decode-under-load -->"


@dataclass(frozen=True)
class Cell:
    condition: str
    policy: str
    tokens_seconds: float  # the sum over the texts of each text's median tokens decode
    restore_seconds: float  # the same for the whole restore
    tokens: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.tokens_seconds


@contextmanager
def competing(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(count)]
    try:
        time.sleep(0.2)  # let the scheduler place them
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


@contextmanager
def policy(name: str) -> Iterator[None]:
    previous = os.environ.get(THREADS_ENV)
    os.environ[THREADS_ENV] = name
    try:
        yield
    finally:
        if previous is None:
            del os.environ[THREADS_ENV]
        else:
            os.environ[THREADS_ENV] = previous


def timed(run: Callable[[], list[int]], expected: list[int]) -> float:
    start = time.perf_counter()
    decoded = run()
    seconds = time.perf_counter() - start
    if decoded != expected:
        raise DecodeVerificationError("a decode under a thread policy returned other tokens")
    return seconds


def measure(model: CausalLM, tokens: int, repeats: int, competitors: int,
            level: str) -> list[Cell]:
    sessions = []
    for kind in TEXT_FILES:
        ids = model.encode_text(shipped_text(kind))[:tokens]
        sessions.append((ids, compress(model, ids, level=level).data))
    samples: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for _ in range(repeats):
        for condition in CONDITIONS:
            for name in POLICIES:
                for index, (ids, data) in enumerate(sessions):
                    with policy(name), competing(competitors if condition == "loaded" else 0):
                        alone = timed(lambda d=data: decompress_tokens(d, model), ids)
                        whole = timed(lambda d=data: decompress(model, d).tokens, ids)
                    samples.setdefault((condition, name, index), []).append((alone, whole))
    cells = []
    for condition in CONDITIONS:
        for name in POLICIES:
            runs = [samples[(condition, name, i)] for i in range(len(sessions))]
            cells.append(Cell(condition, name,
                              sum(statistics.median(a for a, _ in r) for r in runs),
                              sum(statistics.median(w for _, w in r) for r in runs),
                              sum(len(ids) for ids, _ in sessions)))
    return cells


def render(cells: list[Cell], header: RunHeader, setting: str) -> str:
    quiet = {c.policy: c for c in cells if c.condition == "quiet"}
    lines = [
        "## Decoding beside a competing process",
        "",
        header.markdown(),
        "",
        f"{setting}. The portable decode of one session per shipped text kind, "
        "quiet and with the competing processes spinning; tokens/s over the four texts (each "
        "text's median), the tokens decode and the whole restore (tokens, then the KV by one "
        "float prefill on its fixed 2 threads). Ratio: the loaded decode time over the quiet "
        f"one under the same policy; the target is at most {TARGET}x for the default "
        "(adaptive).",
        "",
        "| policy | quiet tokens/s | loaded tokens/s | loaded / quiet time | quiet restore "
        "tokens/s | loaded restore tokens/s | restore loaded / quiet |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in cells:
        if cell.condition != "loaded":
            continue
        base = quiet[cell.policy]
        lines.append(
            f"| {cell.policy}{' (default)' if cell.policy == 'adaptive' else ''} | "
            f"{base.tokens_per_second:.1f} | {cell.tokens_per_second:.1f} | "
            f"{cell.tokens_seconds / base.tokens_seconds:.2f}x | "
            f"{base.tokens / base.restore_seconds:.1f} | "
            f"{cell.tokens / cell.restore_seconds:.1f} | "
            f"{cell.restore_seconds / base.restore_seconds:.2f}x |")
    return "\n".join(lines) + "\n"


def replace_section(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else ""
    block = f"{BEGIN}\n{section}{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--competitors", type=int, default=1)
    parser.add_argument("--level", default="portable")
    parser.add_argument("--markdown", type=Path, default=Path("reports/decode_under_load.md"))
    parser.add_argument("--levels-report", type=Path, default=Path("reports/decode_levels.md"))
    args = parser.parse_args()
    model = load_default_model()
    command = (f"python benchmarks/decode_under_load.py --tokens {args.tokens} --repeats "
               f"{args.repeats} --competitors {args.competitors} --level {args.level}")
    header = start_run(model.name, f"the shipped texts, {args.tokens} tokens per text", command)
    cells = measure(model, args.tokens, args.repeats, args.competitors, args.level)
    setting = f"Level {args.level}; {args.competitors} competing process(es)"
    section = render(cells, header.finished(), setting)
    args.markdown.write_text(section)
    replace_section(args.levels_report, section)
    print(json.dumps([asdict(c) for c in cells], indent=1))


if __name__ == "__main__":
    main()

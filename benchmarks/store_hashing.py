"""Bytes hashed and CPU time of a store put and get that continue a long stored prefix.

A session that extends a stored 4,000-token prefix (SmolLM2-135M: 4,000 x 23,040 float32 KV
bytes, 92 MB) should hash that prefix's KV at most once per put and per get. This script
measures, on one source tree: a directory store, a session A of ``--prefix`` tokens put first
(not measured), then a put of session B = A + ``--tail`` tokens (with the KV of one prefill) and
a get of B from a fresh store object (nothing hot: A's span is decoded too), counting every
byte that goes through SHA-256 (``hashlib.sha256`` wrapped) and the process's CPU seconds.

    python benchmarks/store_hashing.py --compare REV [--prefix 4000] [--tail 200]

runs the measurement on this tree and on ``REV`` (checked out into a temporary git worktree, run
in a subprocess with that tree first on ``PYTHONPATH``), in one run, and writes
``reports/store_hashing.md``. ``--json`` measures this tree only and prints one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Phase:
    bytes_hashed: int
    cpu_seconds: float
    wall_seconds: float


@dataclass(frozen=True)
class Measurement:
    source: str
    commit: str
    prefix_tokens: int
    tail_tokens: int
    level: str
    prefix_kv_bytes: int
    put: Phase
    get: Phase


class _Counter:
    """Counts the bytes fed to ``hashlib.sha256`` objects while installed."""

    def __init__(self) -> None:
        self.bytes = 0
        self._original: Callable[..., Any] = hashlib.sha256

    def install(self) -> None:
        counter = self
        original = self._original

        class Counted:
            def __init__(self, data: Any = b"", **kwargs: Any) -> None:
                self._hash = original(**kwargs)
                self.update(data)

            def update(self, data: Any) -> None:
                counter.bytes += memoryview(data).nbytes
                self._hash.update(data)

            def digest(self) -> bytes:
                return self._hash.digest()

            def hexdigest(self) -> str:
                return self._hash.hexdigest()

            def copy(self) -> Any:
                clone = Counted.__new__(Counted)
                clone._hash = self._hash.copy()
                return clone

        hashlib.sha256 = Counted  # type: ignore[assignment]

    def remove(self) -> None:
        hashlib.sha256 = self._original  # type: ignore[assignment]


def _phase(counter: _Counter, run: Callable[[], object]) -> Phase:
    before = counter.bytes
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    return Phase(counter.bytes - before, time.process_time() - cpu, time.perf_counter() - wall)


def measure(prefix: int, tail: int, level: str) -> Measurement:
    """This tree's figures (the ``seqkv`` on ``sys.path``)."""
    counter = _Counter()
    counter.install()  # before seqkv imports: modules that bind sha256 at import see it too
    try:
        import seqkv
        from seqkv.models import load_default_model
        from seqkv.store import SessionStore

        model = load_default_model()
        text = (Path(seqkv.__file__).parent / "data" / "kinds" / "legal.txt").read_text()
        tokens = (model.encode_text(text) * 4)[: prefix + tail]
        with tempfile.TemporaryDirectory() as folder:
            store = SessionStore.directory(folder, model)
            store.put("a", tokens[:prefix], model.prefill(tokens[:prefix]), level=level,
                      namespace="n")
            kv = model.prefill(tokens)
            put = _phase(counter, lambda: store.put("b", tokens, kv, level=level,
                                                    namespace="n"))
            fresh = SessionStore.directory(folder, model)
            got: list[list[int]] = []
            get = _phase(counter, lambda: got.append(fresh.get("b", namespace="n").tokens))
            assert got == [tokens], "the session did not come back exactly"
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(seqkv.__file__).parent,
                                capture_output=True, text=True, check=False).stdout.strip()
        return Measurement(str(Path(seqkv.__file__).parents[2]), commit, prefix, tail, level,
                           prefix * model.kv_components_per_token * 4, put, get)
    finally:
        counter.remove()


def _in_subprocess(source: Path, prefix: int, tail: int, level: str) -> Measurement:
    environment = {**os.environ, "PYTHONPATH": str(source / "src")}
    script = Path(__file__).resolve()
    output = subprocess.run(
        [sys.executable, str(script), "--json", "--prefix", str(prefix), "--tail", str(tail),
         "--level", level], env=environment, capture_output=True, text=True, check=True,
        cwd=source).stdout
    row = json.loads(output.strip().splitlines()[-1])
    return Measurement(**{**row, "put": Phase(**row["put"]), "get": Phase(**row["get"])})


def render(before: Measurement, after: Measurement, command: str) -> str:
    def row(name: str, m: Measurement, phase: Phase) -> str:
        return (f"| {name} | {m.commit[:12]} | {phase.bytes_hashed:,} | "
                f"{phase.bytes_hashed / m.prefix_kv_bytes:.2f} | {phase.cpu_seconds:.2f} | "
                f"{phase.wall_seconds:.2f} |")

    return "\n".join([
        "# Bytes hashed per store put and get over a long stored prefix",
        "",
        f"Measured by `{command}`: SmolLM2-135M-Instruct (float32), a directory store, session "
        f"A of {after.prefix_tokens:,} tokens of the shipped legal text stored first at "
        f"`{after.level}`, then session B = A + {after.tail_tokens} tokens put with the KV of "
        "one prefill, then got back from a fresh store object (A's span decoded too). Bytes "
        "hashed count every byte through SHA-256; the prefix's KV is "
        f"{after.prefix_kv_bytes:,} bytes. CPU seconds are the measuring process's, both "
        "trees in one run.",
        "",
        "| operation | tree | bytes hashed | / prefix KV bytes | CPU s | wall s |",
        "|---|---|---:|---:|---:|---:|",
        row("put (before)", before, before.put), row("put (after)", after, after.put),
        row("get (before)", before, before.get), row("get (after)", after, after.get),
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=int, default=4000)
    parser.add_argument("--tail", type=int, default=200)
    parser.add_argument("--level", default="ngram")
    parser.add_argument("--json", action="store_true", help="measure this tree only")
    parser.add_argument("--compare", metavar="REV", help="also measure REV, in one run")
    parser.add_argument("--report", default=str(ROOT / "reports" / "store_hashing.md"))
    args = parser.parse_args()
    if args.json or not args.compare:
        print(json.dumps(asdict(measure(args.prefix, args.tail, args.level))))
        return
    # NOTE: imported here, not at the top: a ``--json`` run must install its counter before
    # any seqkv module binds sha256. This process measures nothing itself.
    from seqkv.provenance import headed, start_run

    command = (f"python benchmarks/store_hashing.py --compare {args.compare} --prefix "
               f"{args.prefix} --tail {args.tail} --level {args.level}")
    header = start_run("SmolLM2-135M-Instruct (the embedded model, float32)",
                       f"the shipped legal text, a {args.prefix:,}-token prefix and a "
                       f"{args.tail}-token tail", command)
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.compare],
                       cwd=ROOT, check=True, capture_output=True)
        try:
            before = _in_subprocess(tree, args.prefix, args.tail, args.level)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=False, capture_output=True)
    after = _in_subprocess(ROOT, args.prefix, args.tail, args.level)
    report = headed(render(before, after, command), header.finished())
    Path(args.report).write_text(report)
    print(report)


if __name__ == "__main__":
    main()

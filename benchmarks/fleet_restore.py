"""Fleet restore: many distinct sessions restored at once, against one prefill's throughput.

``--sessions`` (default 16, 64 and 256) distinct sessions of ``--tokens`` tokens (default 200)
are cut from the four text kinds (the shipped texts and the held-out ones under
``benchmarks/texts/heldout``, one token sequence per kind, windows at distinct offsets: no two
sessions share a first token position, so none is a prefix of another and the store finds no
shared prefix). Each fleet is restored two ways, each exact (tokens and KV digests verified):

* ``get_many`` from a directory store put at ``--level`` and then opened fresh (a new store
  object: the hot tier empty, every span read from disk and decoded);
* ``decompress_batch`` of one ``.skv`` file per session.

Both include the KV: the tokens are decoded, then the KV rebuilt by float prefills. The figure is
tokens restored per second against one prefill's throughput on the same machine (the median of
``--repeats`` prefills of one ``--tokens``-token session, run just before each fleet): the target
for 64 sessions is at least 0.5x. Writes ``--markdown`` (default ``reports/fleet_restore.md``)
and prints the JSON.

Usage: ``PYTHONPATH=src python benchmarks/fleet_restore.py [--sessions 16 64 256] [--tokens 200]
[--level portable]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from seqkv.bench.texts import TEXT_FILES, shipped_text
from seqkv.errors import DecodeVerificationError
from seqkv.models import CausalLM, load_default_model
from seqkv.provenance import RunHeader, start_run
from seqkv.skv import compress, decompress_batch
from seqkv.store import SessionStore

HELD_OUT = Path(__file__).resolve().parent / "texts" / "heldout"
TARGET_64 = 0.5
NAMESPACE = "fleet"


@dataclass(frozen=True)
class FleetRun:
    sessions: int
    tokens: int  # restored in all
    prefill_tokens_per_second: float
    get_many_seconds: float
    decompress_batch_seconds: float

    @property
    def get_many_ratio(self) -> float:
        return self.tokens / self.get_many_seconds / self.prefill_tokens_per_second

    @property
    def decompress_batch_ratio(self) -> float:
        return self.tokens / self.decompress_batch_seconds / self.prefill_tokens_per_second


def kind_stream(model: CausalLM, kind: str) -> list[int]:
    """One token sequence per kind: the shipped text, then the held-out one where it exists."""
    text = shipped_text(kind)
    held_out = HELD_OUT / f"{kind}.txt"
    if held_out.exists():
        text += "\n\n" + held_out.read_text("utf-8")
    return model.encode_text(text)


def fleet(model: CausalLM, count: int, tokens: int) -> list[list[int]]:
    """``count`` distinct windows of ``tokens`` tokens, spread evenly over the kinds."""
    streams = [kind_stream(model, kind) for kind in TEXT_FILES]
    sessions: list[list[int]] = []
    per_kind = -(-count // len(streams))
    for stream in streams:
        room = len(stream) - tokens
        if room < per_kind:
            raise SystemExit(f"a kind holds {len(stream)} tokens: too few for {per_kind} "
                             f"distinct {tokens}-token windows")
        step = room // per_kind
        sessions += [stream[i * step:i * step + tokens] for i in range(per_kind)]
    return sessions[:count]


def prefill_rate(model: CausalLM, tokens: list[int], repeats: int) -> float:
    """Tokens/s of one prefill (``CausalLM.prefill``, a serving engine's), the median."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.prefill(tokens)
        samples.append(time.perf_counter() - start)
    return len(tokens) / statistics.median(samples)


def run(model: CausalLM, count: int, tokens: int, level: str, repeats: int,
        workdir: Path) -> FleetRun:
    sessions = fleet(model, count, tokens)
    files = [compress(model, s, model.prefill(s), level=level).data for s in sessions]
    path = workdir / f"store-{count}"
    store = SessionStore.directory(path, model)
    for index, session in enumerate(sessions):
        store.put(f"s{index}", session, model.prefill(session), level=level, namespace=NAMESPACE)
    store.close()
    rate = prefill_rate(model, sessions[0], repeats)
    fresh = SessionStore.directory(path, model)
    start = time.perf_counter()
    restored = fresh.get_many([f"s{i}" for i in range(count)], namespace=NAMESPACE)
    get_seconds = time.perf_counter() - start
    fresh.close()
    start = time.perf_counter()
    decoded = decompress_batch(model, files)
    batch_seconds = time.perf_counter() - start
    if ([list(r.tokens) for r in restored] != sessions
            or [list(d.tokens) for d in decoded] != sessions):
        raise DecodeVerificationError("a fleet restore returned other tokens")
    return FleetRun(count, count * tokens, rate, get_seconds, batch_seconds)


def render(runs: list[FleetRun], header: RunHeader, level: str) -> str:
    lines = [
        "# Fleet restore: many sessions at once against one prefill",
        "",
        header.markdown(),
        "",
        f"Level {level}. Distinct sessions cut from the four text kinds; each restore "
        "decodes the tokens and rebuilds the KV (float prefills), verified by its digests. "
        f"Ratio: restored tokens/s over one prefill's tokens/s (target at 64 sessions: at least "
        f"{TARGET_64}x).",
        "",
        "| sessions | tokens | one prefill tokens/s | get_many (fresh store) s | tokens/s | ratio "
        "| decompress_batch s | tokens/s | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.sessions} | {r.tokens} | {r.prefill_tokens_per_second:.0f} | "
            f"{r.get_many_seconds:.1f} | {r.tokens / r.get_many_seconds:.0f} | "
            f"{r.get_many_ratio:.2f}x | {r.decompress_batch_seconds:.1f} | "
            f"{r.tokens / r.decompress_batch_seconds:.0f} | {r.decompress_batch_ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--level", default="portable")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown", type=Path, default=Path("reports/fleet_restore.md"))
    args = parser.parse_args()
    model = load_default_model()
    command = (f"python benchmarks/fleet_restore.py --sessions "
               f"{' '.join(map(str, args.sessions))} --tokens {args.tokens} --level {args.level}")
    header = start_run(model.name, f"distinct {args.tokens}-token sessions cut from the four "
                                   "shipped text kinds", command)
    runs: list[FleetRun] = []
    with tempfile.TemporaryDirectory() as scratch:
        for count in args.sessions:
            runs.append(run(model, count, args.tokens, args.level, args.repeats, Path(scratch)))
            # NOTE: the report after every fleet: a 256-session fleet can take longer than a
            # run is given, and the smaller fleets' rows should survive it
            args.markdown.write_text(render(runs, header.finished(), args.level))
    print(json.dumps([{**asdict(r), "get_many_ratio": r.get_many_ratio,
                       "decompress_batch_ratio": r.decompress_batch_ratio} for r in runs],
                     indent=1))


if __name__ == "__main__":
    main()

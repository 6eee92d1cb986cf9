"""Single-session restore against what a user would do instead: zstd -d of the text + one prefill.

For each text kind (one token sequence per kind: the shipped text, then the held-out one, as
``fleet_restore.kind_stream`` builds it) the first ``--tokens`` tokens (default 600) are turned
back into text and that text is the session: its tokens are what both sides restore. Timed per
kind, alternately in one loop (``--repeats`` rounds, medians), with the model loaded and its
integer weights prepared beforehand on both sides (model load excluded):

* **zstd + prefill** (the reference): ``zstandard`` decompression of the text compressed at level
  19, tokenization, one prefill (``CausalLM.prefill``, a serving engine's: the KV of every
  position);
* **restore** at each ``--levels`` level: ``seqkv.decompress`` of the session's ``.skv`` bytes
  (the tokens decoded and verified, then the KV rebuilt and checked against its digest);
* **floor** of a model-coded level: one integer forward over the session's tokens (what the
  decoder would cost if every token were known up front: the encoder's forward) plus the float
  prefill: no sequential decode can be faster.

The figure per level is the median over the kinds of restore time / reference time (targets:
at most 4x at the fastest exact level, at most 6x at ``portable``). Writes ``--markdown``
(default ``reports/restore_vs_zstd.md``) and prints the JSON.

Usage: ``PYTHONPATH=src python benchmarks/restore_vs_zstd.py [--tokens 600] [--repeats 3]
[--levels portable portable4 ngram plain]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import zstandard
from fleet_restore import kind_stream

from seqkv.bench.texts import TEXT_FILES
from seqkv.errors import DecodeVerificationError
from seqkv.models import CausalLM, load_default_model
from seqkv.models.integer import IntegerForward, integer_weights
from seqkv.models.integer.blocks import block_weights
from seqkv.provenance import RunHeader, start_run
from seqkv.skv import compress, decompress

TARGETS = {"fastest": 4.0, "portable": 6.0}
# The integer weights each model-coded level decodes with (its floor's forward).
INTEGER_FORMS = {"portable": integer_weights, "portable+mix": integer_weights,
                 "portable4": block_weights}


@dataclass(frozen=True)
class KindRun:
    kind: str
    tokens: int
    text_bytes: int
    zstd_bytes: int
    reference_seconds: float  # zstd -d + tokenize + prefill, median
    restore_seconds: dict[str, float]  # per level, median
    file_bytes: dict[str, int]
    floor_seconds: dict[str, float]  # integer forward + float prefill, per model-coded level

    def ratio(self, level: str) -> float:
        return self.restore_seconds[level] / self.reference_seconds


def _session(model: CausalLM, kind: str, tokens: int) -> tuple[str, list[int]]:
    """The first ``tokens`` tokens of the kind as text, and that text's tokens."""
    text = model.decode_tokens(kind_stream(model, kind)[:tokens])
    return text, model.encode_text(text)


def _time_into(run: Callable[[], object], samples: list[float]) -> None:
    start = time.perf_counter()
    run()
    samples.append(time.perf_counter() - start)


def measure_kind(model: CausalLM, kind: str, tokens: int, levels: list[str],
                 repeats: int) -> KindRun:
    text, session = _session(model, kind, tokens)
    packed = zstandard.ZstdCompressor(level=19).compress(text.encode("utf-8"))
    files = {level: compress(model, session, model.prefill(session), level=level).data
             for level in levels}
    engines = {level: IntegerForward(INTEGER_FORMS[level](model)) for level in levels
               if level in INTEGER_FORMS}

    def reference() -> None:
        restored = zstandard.ZstdDecompressor().decompress(packed).decode("utf-8")
        ids = model.encode_text(restored)
        if ids != session:
            raise DecodeVerificationError("the zstd round trip tokenized to other tokens")
        model.prefill(ids)

    def restore(level: str) -> Callable[[], None]:
        def run() -> None:
            result = decompress(model, files[level])
            if result.tokens != session or not result.kv_exact:
                raise DecodeVerificationError(f"{level} restored other tokens or another KV")
        return run

    def floor(level: str) -> Callable[[], None]:
        engine = engines[level]
        return lambda: (engine.forward([(engine.new_sequence(), session)]),
                        model.prefill(session))

    runs: dict[str, Callable[[], object]] = {"reference": reference}
    runs |= {f"restore:{level}": restore(level) for level in levels}
    runs |= {f"floor:{level}": floor(level) for level in engines}
    for run in runs.values():  # warm-up: weights prepared, tables built, caches allocated
        run()
    samples: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            _time_into(run, samples[key])
    medians = {key: statistics.median(values) for key, values in samples.items()}
    return KindRun(
        kind, len(session), len(text.encode("utf-8")), len(packed), medians["reference"],
        {level: medians[f"restore:{level}"] for level in levels},
        {level: len(data) for level, data in files.items()},
        {level: medians[f"floor:{level}"] for level in engines})


def summary(runs: list[KindRun], levels: list[str]) -> dict[str, float]:
    """Median over the kinds of restore / reference, per level."""
    return {level: statistics.median(r.ratio(level) for r in runs) for level in levels}


def render(runs: list[KindRun], levels: list[str], header: RunHeader) -> str:
    ratios = summary(runs, levels)
    fastest = min(ratios, key=ratios.__getitem__)
    coded = [level for level in levels if level in INTEGER_FORMS]
    fastest_coded = min(coded, key=ratios.__getitem__) if coded else None
    lines = [
        "# Single-session restore against zstd -d + one prefill",
        "",
        header.markdown(),
        "",
        "Per kind, the first tokens of the kind's text as text; the "
        "reference decompresses its zstd -19 bytes, tokenizes and runs one prefill; a restore "
        "is `seqkv.decompress` of the session's `.skv` (tokens decoded and verified, KV "
        "rebuilt and checked against its digest). Model load and weight preparation excluded "
        "on both sides; medians of alternating runs. Floor: one integer forward over the "
        "session's tokens + the float prefill.",
        "",
        "| kind | tokens | zstd -19 bytes | zstd -d + prefill s | "
        + " | ".join(f"{level} s (x) | {level} bytes" for level in levels)
        + " | " + " | ".join(f"{level} floor s (x)" for level in coded) + " |",
        "|---|---:|---:|---:|" + "---:|---:|" * len(levels) + "---:|" * len(coded),
    ]
    for r in runs:
        cells = [f"{r.restore_seconds[level]:.2f} ({r.ratio(level):.2f}x) | "
                 f"{r.file_bytes[level]:,}" for level in levels]
        floors = [f"{r.floor_seconds[level]:.2f} "
                  f"({r.floor_seconds[level] / r.reference_seconds:.2f}x)" for level in coded]
        lines.append(f"| {r.kind} | {r.tokens} | {r.zstd_bytes:,} | {r.reference_seconds:.3f} | "
                     + " | ".join(cells) + " | " + " | ".join(floors) + " |")
    lines += ["", "Median over the kinds, restore / reference:", ""]
    for level in levels:
        target = TARGETS.get(level)
        note = f" (target at most {target:g}x: {'met' if ratios[level] <= target else 'NOT met'})" \
            if target is not None else ""
        lines.append(f"- `{level}`: {ratios[level]:.2f}x{note}")
    lines.append("")
    lines.append(f"Fastest exact level measured: `{fastest}`, {ratios[fastest]:.2f}x (target at "
                 f"most {TARGETS['fastest']:g}x: "
                 f"{'met' if ratios[fastest] <= TARGETS['fastest'] else 'NOT met'}).")
    if fastest_coded is not None:
        lines.append(f"Fastest model-coded level: `{fastest_coded}`, "
                     f"{ratios[fastest_coded]:.2f}x (against the same 4x: "
                     f"{'met' if ratios[fastest_coded] <= TARGETS['fastest'] else 'NOT met'}).")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--levels", nargs="+", default=["portable", "portable4", "ngram",
                                                        "plain"])
    parser.add_argument("--kinds", nargs="+", default=list(TEXT_FILES))
    parser.add_argument("--markdown", default="reports/restore_vs_zstd.md")
    args = parser.parse_args()
    model = load_default_model()
    command = (f"python benchmarks/restore_vs_zstd.py --tokens {args.tokens} --repeats "
               f"{args.repeats} --levels {' '.join(args.levels)}")
    header = start_run(model.name, f"the first {args.tokens} tokens of each kind's shipped "
                                   f"text ({', '.join(args.kinds)})", command)
    runs = [measure_kind(model, kind, args.tokens, args.levels, args.repeats)
            for kind in args.kinds]
    with open(args.markdown, "w", encoding="utf-8") as out:
        out.write(render(runs, args.levels, header.finished()))
    print(json.dumps({"runs": [asdict(r) for r in runs],
                      "median_ratio": summary(runs, args.levels)}, indent=1))


if __name__ == "__main__":
    main()

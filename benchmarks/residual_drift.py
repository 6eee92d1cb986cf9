"""How far the decoder's recomputed KV drifts from one prefill's, by text length and kind.

A caller's KV usually comes from one prefill; the decoder recomputes it along its own schedule
(token-by-token steps at the ``tokens`` level, the row-invariant forward in chunks at the others),
and the two differ in the last bits. The KV residual stores that difference at the file's
tolerance, and every component that drifts further than the tolerance is an escape (its float32
bits stored whole). This script measures the drift on texts from a hundred tokens up to the
model's context, so the default tolerance can be set with a stated margin; it writes
``reports/residual_drift.md``.

    python benchmarks/residual_drift.py [--lengths 128 512 2048 8192] [--steps-up-to 512]
                                        [--text KIND=PATH ...]

Without ``--text``, each shipped kind (prose, code, legal, technical) is repeated to the length
needed: a stand-in for long texts of that kind (the drift is a property of float schedules, not of
novelty). Lengths above a text's own tokens are skipped for ``--text`` files.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from seqkv.bench.figures import TEXT_FILES, shipped_text
from seqkv.models import CausalLM, load_default_model
from seqkv.models.rows import row_forward
from seqkv.schedule import pinned_threads

TOLERANCES = (1e-4, 3e-4, 1e-3, 3e-3)


@dataclass(frozen=True)
class Drift:
    text: str
    tokens: int
    schedule: str  # the decoder's: "token-by-token" or "rows"
    max_abs: float
    p99_99_abs: float
    escape_fraction: dict[str, float]  # components beyond each tolerance
    seconds: float


def _drift(text: str, schedule: str, prefill: torch.Tensor, recomputed: torch.Tensor,
           seconds: float) -> Drift:
    diff = (prefill - recomputed).abs().reshape(-1)
    sample = diff if diff.numel() <= 16_000_000 else diff[:: diff.numel() // 16_000_000 + 1]
    return Drift(text, int(prefill.shape[3]), schedule, float(diff.max()),
                 float(torch.quantile(sample, 0.9999)),
                 {f"{t:g}": float((diff > t).double().mean()) for t in TOLERANCES}, seconds)


def measure(model: CausalLM, label: str, tokens: list[int], steps_up_to: int) -> list[Drift]:
    with torch.inference_mode():
        prefill = model.kv_tensor(model.prefill(tokens))  # [L, 2, H, T, D]
    rows = []
    if len(tokens) <= steps_up_to:
        started = time.perf_counter()
        stepper = model.new_stepper()
        with pinned_threads():
            for token in tokens:
                stepper.step(token)
        rows.append(_drift(label, "token-by-token", prefill, model.kv_tensor(stepper.cache),
                           time.perf_counter() - started))
    engine = row_forward(model)
    started = time.perf_counter()
    sequence = engine.new_sequence()
    for start in range(0, len(tokens), 256):
        engine.forward([(sequence, tokens[start : start + 256])])
    rows.append(_drift(label, "rows", prefill, sequence.kv().float(),
                       time.perf_counter() - started))
    return rows


def render(rows: list[Drift], model: CausalLM, command: str) -> str:
    lines = [
        "# KV drift between one prefill and the decoder's recomputation",
        "",
        f"Measured by `{command}`: model {model.name}; 2-core x86_64 CPU; float32.",
        "",
        "| text | tokens | decoder schedule | max abs | 99.99th pct | "
        + " | ".join(f"> {t:g}" for t in TOLERANCES) + " |",
        "|---|---:|---|---:|---:|" + "---:|" * len(TOLERANCES),
    ]
    for r in rows:
        lines.append(f"| {r.text} | {r.tokens:,} | {r.schedule} | {r.max_abs:.2e} | "
                     f"{r.p99_99_abs:.2e} | "
                     + " | ".join(f"{r.escape_fraction[f'{t:g}']:.2e}" for t in TOLERANCES)
                     + " |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048, 8192])
    parser.add_argument("--steps-up-to", type=int, default=512,
                        help="also measure token-by-token recomputation up to this length")
    parser.add_argument("--text", action="append", default=[], metavar="KIND=PATH")
    parser.add_argument("--report", default="reports/residual_drift.md")
    args = parser.parse_args()
    model = load_default_model()
    sources: dict[str, list[int]] = {}
    for item in args.text:
        kind, _, path = item.partition("=")
        sources[kind] = model.encode_text(Path(path).read_text(encoding="utf-8"))
    if not sources:
        for kind in TEXT_FILES:
            base = model.encode_text(shipped_text(kind))
            repeats = -(-max(args.lengths) // len(base))
            sources[f"{kind} (repeated)"] = (base * repeats)[: max(args.lengths)]
    rows: list[Drift] = []
    for label, tokens in sources.items():
        for length in args.lengths:
            if length <= len(tokens):
                rows += measure(model, label, tokens[:length], args.steps_up_to)
                print(json.dumps(asdict(rows[-1])), flush=True)
    command = "python benchmarks/residual_drift.py " + " ".join(
        [f"--lengths {' '.join(map(str, args.lengths))}", f"--steps-up-to {args.steps_up_to}",
         *(f"--text {t}" for t in args.text)])
    Path(args.report).write_text(render(rows, model, command))
    worst = max(r.max_abs for r in rows)
    print(json.dumps({"worst_max_abs": worst, "lengths": args.lengths,
                      "p99_99_worst": float(np.max([r.p99_99_abs for r in rows]))}))


if __name__ == "__main__":
    main()

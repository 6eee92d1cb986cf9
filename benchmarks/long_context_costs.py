"""Two costs at long context that the full-context run showed: the reference cross-entropy's
peak memory, and one integer step's time.

* ``reference``: ``seqkv.bounds.reference_surprisal`` over the long prose text's first
  ``--tokens`` tokens (default 8,185, as ``full_context.py``), with the process's peak resident
  memory before and after (``ru_maxrss``: the loaded model, then the reference on top of it).
* ``step``: the integer predictor (``IntegerForward``, native path) fed ``--context`` tokens of
  the same text in chunks of 256, then ``--steps`` one-row steps timed one by one on
  ``--threads`` threads (minimum and median, milliseconds).

Usage: ``PYTHONPATH=src python benchmarks/long_context_costs.py reference [--tokens 8185]`` or
``... step [--context 4096] [--steps 40] [--threads 2]``. Prints one JSON line. Measured on
this machine beside other work: state the load when quoting it.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

from long_checks import LONG_TEXTS
from machine import load_average

from seqkv.bounds import reference_surprisal
from seqkv.models import load_default_model
from seqkv.models.integer.forward import IntegerForward
from seqkv.schedule import pinned_threads


def _peak_mib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("reference", "step"))
    parser.add_argument("--tokens", type=int, default=8185)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = load_default_model()
    ids = model.encode_text((LONG_TEXTS / "prose.txt").read_text("utf-8"))
    result: dict[str, object] = {"what": args.what, "load_before": load_average()}
    if args.what == "reference":
        tokens = ids[: args.tokens]
        before = _peak_mib()
        started = time.perf_counter()
        bits = reference_surprisal(model, [tokens], model.start_token_id)
        result |= {"tokens": len(tokens), "seconds": time.perf_counter() - started,
                   "peak_mib_model_loaded": before, "peak_mib_after": _peak_mib(),
                   "bits_sum": float(bits.sum())}
    else:
        engine = IntegerForward(model)
        sequence = engine.new_sequence()
        times = []
        with pinned_threads(args.threads):
            for start in range(0, args.context, 256):
                engine.forward([(sequence, ids[start : min(start + 256, args.context)])])
            for k in range(args.steps):
                started = time.perf_counter()
                engine.forward([(sequence, [ids[args.context + k]])])
                times.append(time.perf_counter() - started)
        result |= {"context": args.context, "threads": args.threads, "backend": engine.backend,
                   "step_ms_min": 1e3 * min(times),
                   "step_ms_median": 1e3 * statistics.median(times)}
    result["load_after"] = load_average()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Three costs at long context that the full-context run showed: the reference cross-entropy's
peak memory, one integer step's time, and one float token step's time.

* ``reference``: ``seqkv.bounds.reference_surprisal`` over the long prose text's first
  ``--tokens`` tokens (default 8,185, as ``full_context.py``), with the process's peak resident
  memory before and after (``ru_maxrss``: the loaded model, then the reference on top of it).
* ``step``: the integer predictor (``IntegerForward``, native path) fed ``--context`` tokens of
  the same text in chunks of 256, then ``--steps`` one-row steps timed one by one on
  ``--threads`` threads (minimum and median, milliseconds).
* ``float-step``: the ``tokens`` level's schedule (``CausalLM.new_stepper``, one thread) from the
  KV of one prefill of ``--context`` tokens, ``--steps`` token steps timed one by one, on the
  stepper's ``AppendingCache`` and on a ``DynamicCache`` (which copies the whole cache each
  step), alternating ``--repeats`` times; the logits of both are compared bit for bit.

Usage: ``PYTHONPATH=src python benchmarks/long_context_costs.py reference [--tokens 8185]`` or
``... step [--context 4096] [--steps 40] [--threads 2]`` or ``... float-step [--context 4096]
[--steps 40] [--repeats 2]``. Prints one JSON line. Measured on this machine beside other work:
state the load when quoting it.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import torch
from long_checks import LONG_TEXTS
from machine import load_average

from seqkv.bounds import reference_surprisal
from seqkv.kvcache import cache_from_tensor
from seqkv.models import CausalLM, load_default_model
from seqkv.models.adapter import Stepper
from seqkv.models.integer.forward import IntegerForward
from seqkv.schedule import pinned_threads


def _peak_mib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _float_steps(model: CausalLM, kv: torch.Tensor, tokens: list[int], appending: bool
                 ) -> tuple[list[float], list[torch.Tensor]]:
    """Step ``tokens`` from ``kv`` on the tokens level's schedule: (seconds, logits) per step."""
    stepper = (model.new_stepper(kv) if appending
               else Stepper(model.model, cache_from_tensor(kv)))
    times, logits = [], []
    with pinned_threads():
        for token in tokens:
            started = time.perf_counter()
            logits.append(torch.from_numpy(stepper.step(token)))
            times.append(time.perf_counter() - started)
    return times, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("reference", "step", "float-step"))
    parser.add_argument("--tokens", type=int, default=8185)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
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
    elif args.what == "float-step":
        kv = model.kv_tensor(model.prefill(ids[: args.context]))
        steps = ids[args.context : args.context + args.steps]
        times: dict[str, list[float]] = {"dynamic": [], "appending": []}
        same = True
        for _ in range(args.repeats):
            dynamic, dynamic_logits = _float_steps(model, kv, steps, appending=False)
            appending, appending_logits = _float_steps(model, kv, steps, appending=True)
            times["dynamic"] += dynamic
            times["appending"] += appending
            same = same and all(torch.equal(a, b)
                                for a, b in zip(dynamic_logits, appending_logits, strict=True))
        result |= {"context": args.context, "steps": len(steps), "repeats": args.repeats,
                   "logits_identical": same}
        for name, measured in times.items():
            result[f"{name}_step_ms_min"] = 1e3 * min(measured)
            result[f"{name}_step_ms_median"] = 1e3 * statistics.median(measured)
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

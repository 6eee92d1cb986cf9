"""``seqkv bench``: the regression gates, deterministic figures and timing ratios.

The measurements of each layer on generated workloads (``decode``, ``mix``, ``store``, ``trie``,
``quant``) are not part of the product: they run from a checkout as ``python -m research.bench``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from seqkv.cli import common


def _cmd_bench_figures(args: argparse.Namespace) -> int:
    from seqkv.bench import figures as gate
    from seqkv.schedule import cpu_model

    model = common.load_for(args)
    root = Path(args.baselines) if args.baselines else gate.baselines_root()
    current = gate.measure_figures(model)
    if args.record:
        paths = gate.record(model, current, root, recorded_on=cpu_model())
        print(f"recorded {len(current)} rows of deterministic figures in "
              f"{', '.join(map(str, paths))}")
        return 0
    report = gate.gate(model, current, root)
    if args.json:
        print(json.dumps({
            "passed": report.passed, "float_profile": report.float_profile.key,
            "float_gated": report.float_gated, "baselines": str(root),
            "figures": [asdict(f) for f in current],
            "integer_changes": [asdict(c) for c in report.integer_changes],
            "float_changes": (None if report.float_changes is None else
                              [asdict(c) for c in report.float_changes]),
            "nearest_float_profile": None if report.nearest is None else report.nearest.path.stem,
            "nearest_changes": [asdict(c) for c in report.nearest_changes]}))
    else:
        print(report.render())
    return 0 if report.passed else 1


def _cmd_bench_timing(args: argparse.Namespace) -> int:
    from seqkv.bench import timing

    model = common.load_for(args)
    if args.record:
        run = timing.measure(model, args.rounds)
        path = timing.history_path(run.profile)
        timing.record_run(path, run)
        medians = ", ".join(f"{name} {run.median(name):.3f}" for name in run.samples)
        print(f"recorded a timing run of {run.commit[:12]} for profile {run.profile} in {path}: "
              f"{medians}")
        return 0
    verdict, _ = timing.run_gate(model, args.rounds, log=None if args.json else print)
    if args.json:
        print(json.dumps(asdict(verdict) | {"passed": verdict.passed}))
    else:
        print(verdict.render())
    return 0 if verdict.passed else 1


def add_bench(commands: common.Subparsers) -> None:
    bench = commands.add_parser("bench", help="the regression gates: deterministic figures and "
                                "timing ratios")
    benches = bench.add_subparsers(dest="bench", required=True)
    bt2 = benches.add_parser("timing", help="the timing gate: encode and decode of the portable "
                             "and ngram levels as ratios to one prefill, against the median of "
                             "this machine profile's last recorded clean runs; exit 1 when one "
                             "is slower than its threshold")
    common.model_option(bt2)
    bt2.add_argument("--record", action="store_true",
                     help="append this run to the profile's history (refused on a tree with "
                          "uncommitted changes)")
    bt2.add_argument("--rounds", type=common.int_in(1, 1000), default=5,
                     help="paired rounds per ratio (default 5)")
    common.json_option(bt2)
    common.progress_option(bt2)
    bt2.set_defaults(run=_cmd_bench_timing)

    bf = benches.add_parser("figures", help="deterministic figures of every level (code bits, "
                            "file bytes, residual bits, forwards) against the committed baselines: "
                            "the integer levels' (every machine) and this profile's float "
                            "levels' (where recorded); exit 1 on any difference")
    common.model_option(bf)
    bf.add_argument("--record", action="store_true",
                    help="write the integer baseline and this profile's float baseline instead "
                         "of comparing with them")
    bf.add_argument("--baselines", default=None, metavar="DIR", type=common.output_folder,
                    help="folder of the baselines (default: the ones shipped in the package, "
                         "seqkv/data/baselines/figures)")
    common.json_option(bf)
    common.progress_option(bf)
    bf.set_defaults(run=_cmd_bench_figures)

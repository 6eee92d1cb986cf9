"""``seqkv check``: the paper's bounds, premises and claims measured on a text or a file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seqkv.checker import check_skv, check_text_tokens, render_markdown
from seqkv.checker.run import CheckOptions
from seqkv.cli import common
from seqkv.codec import DEFAULT_TOLERANCE
from seqkv.container import MAGIC


def _cmd_check(args: argparse.Namespace) -> int:
    source = Path(args.input)
    options = CheckOptions(seed=args.seed, kv_positions=args.kv_positions,
                           entropy_contexts=args.entropy_contexts)
    data = common.read_bytes(args.input)
    model = common.load(args.model)
    baselines = Path(args.baselines)
    if data.startswith(MAGIC):
        report = check_skv(model, data, args.input, options, progress=True, baselines=baselines)
    else:
        tokens = model.encode_text(common.read_text(args.input))
        report = check_text_tokens(model, tokens, args.input, args.tolerance, options,
                                   progress=True, baselines=baselines)
    target = Path(args.report) if args.report else Path("reports") / f"check-{source.stem}.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    common.write_text(str(target), render_markdown(report))
    if args.json:
        print(json.dumps(report.to_json_dict() | {"report": str(target)}, default=str))
    else:
        failed = [c.name for c in report.checks if c.kind == "bound" and not c.holds]
        verdict = "PASS" if report.passed else f"FAIL ({', '.join(failed)})"
        print(f"seqkv check: {verdict}; report written to {target}")
    return 0 if report.passed else 1


def add_check(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k = commands.add_parser("check", help="check the paper's bounds on a text or .skv file and "
                                         "write a markdown proof-check report")
    k.add_argument("input", metavar="TEXT|FILE.skv")
    common.model_option(k)
    k.add_argument("--report", metavar="PATH", help="report file (default reports/check-NAME.md)")
    k.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    k.add_argument("--seed", type=int, default=0, help="seed of the Monte-Carlo estimates")
    k.add_argument("--kv-positions", type=int, default=CheckOptions.kv_positions, metavar="N",
                   help="prefixes drawn from the data for H(KV | prefix) vs H(t | prefix) "
                        f"(default {CheckOptions.kv_positions})")
    k.add_argument("--entropy-contexts", type=int, default=CheckOptions.entropy_contexts,
                   metavar="N", help="contexts drawn from the data for the model's entropy "
                   f"rate (default {CheckOptions.entropy_contexts}, 2 or more)")
    k.add_argument("--baselines", default=str(Path("benchmarks") / "baselines" / "figures"),
                   metavar="DIR", help="committed deterministic figures: a text found there has "
                   "its code length gated exactly (default benchmarks/baselines/figures)")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.set_defaults(run=_cmd_check)


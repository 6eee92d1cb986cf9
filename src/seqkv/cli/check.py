"""``seqkv check``: the paper's bounds, premises and claims measured on a text or a file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seqkv.checker import check_skv, check_text_tokens, render_markdown
from seqkv.checker.run import CheckOptions
from seqkv.cli import common
from seqkv.codec import DEFAULT_TOLERANCE
from seqkv.formats.skv import MAGIC
from seqkv.levels import DEFAULT_LEVEL
from seqkv.provenance import start_run


def default_report(source: str) -> str:
    return str(Path("reports") / f"check-{Path(source).stem}.md")


def _cmd_check(args: argparse.Namespace) -> int:
    reporter = common.reporter_of(args)
    options = CheckOptions(seed=args.seed, entropy_contexts=args.entropy_contexts)
    reporter.phase("load the model")
    model = common.load_for(args)
    baselines = None if args.baselines is None else Path(args.baselines)
    reporter.phase("check")
    # NOTE: model and data are stated by the report's own lines (with their digests).
    header = start_run(model=model.name, data=args.input)
    data = common.read_bytes(args.input)
    if data.startswith(MAGIC):  # formats 1 and 2 start with these bytes too
        report = check_skv(model, data, args.input, options, progress=reporter.sink,
                           baselines=baselines, max_tokens=args.max_tokens,
                           max_memory_bytes=common.memory_limit(args))
    else:
        tokens = model.encode_text(common.read_text(args.input, common.text_limit(model)))
        model.check_tokens(tokens)
        report = check_text_tokens(model, tokens, args.input, args.tolerance, options,
                                   progress=reporter.sink, baselines=baselines,
                                   level=args.level)
    target = Path(args.report)
    common.make_folder(target.parent)
    common.write_text(str(target), render_markdown(report, header.finished()))
    if args.json:
        print(json.dumps(report.to_json_dict() | {"report": str(target)}, default=str))
    else:
        failed = [c.name for c in report.checks if c.kind == "bound" and not c.holds]
        verdict = "PASS" if report.passed else f"FAIL ({', '.join(failed)})"
        print(f"seqkv check: {verdict}; report written to {target}")
    return 0 if report.passed else 1


def add_check(commands: common.Subparsers) -> None:
    k = commands.add_parser("check", help="check the paper's bounds on a text or .skv file and "
                                         "write a markdown proof-check report")
    k.add_argument("input", metavar="TEXT|FILE.skv", type=common.input_file_no_stdin)
    common.model_option(k)
    k.add_argument("--report", metavar="PATH", type=common.output_file_in_new_folder,
                   help="report file (default reports/check-NAME.md)")
    common.tolerance_option(k, DEFAULT_TOLERANCE)
    k.add_argument("--seed", type=common.int_in(0, 2**63 - 1), default=0,
                   help="seed of the Monte-Carlo estimates")
    k.add_argument("--level", type=common.level_name, default=DEFAULT_LEVEL,
                   help=f"the level a text is coded at (default {DEFAULT_LEVEL}); a .skv file "
                        "is checked at its own")
    k.add_argument("--entropy-contexts", type=common.int_in(2, 100_000),
                   default=CheckOptions.entropy_contexts,
                   metavar="N", help="contexts drawn from the data for the model's entropy "
                   f"rate (default {CheckOptions.entropy_contexts}, 2 or more)")
    k.add_argument("--baselines", default=None, metavar="DIR", type=_folder_or_missing,
                   help="committed deterministic figures: a text found there has its code length "
                        "gated exactly (default: the baselines shipped in the package, "
                        "seqkv/data/baselines/figures)")
    common.decode_limit_options(k)
    common.json_option(k)
    common.progress_option(k)
    k.set_defaults(run=_cmd_check, paths=common.PathRoles(("input",), ("report",)),
                   complete=_complete)


def _folder_or_missing(text: str) -> str:
    """A folder to read baselines from: absent is allowed (no gate), a file is not."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder")
    return text


def _complete(args: argparse.Namespace) -> None:
    """The default report path, checked like one given."""
    if args.report is None:
        args.report = common.output_file_in_new_folder(default_report(args.input))


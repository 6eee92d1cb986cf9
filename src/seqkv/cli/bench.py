"""``seqkv bench``: each layer measured on a generated workload, and the deterministic gate."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from seqkv.bench.decode import (
    DEFAULT_LEVELS,
    SHIPPED_TEXTS,
    forward_costs,
    render_markdown,
    run_decode_bench,
    shipped_texts,
    texts_tokens,
)
from seqkv.cli import common
from seqkv.errors import UsageError


def _cmd_bench_trie(args: argparse.Namespace) -> int:
    from seqkv.trie import run_trie_bench

    result = run_trie_bench(seed=args.seed)
    common.print_figures(result.to_json_dict(), args.json,
                         "seqkv bench trie: generated multi-session workload")
    return 0


def _cmd_bench_quant(args: argparse.Namespace) -> int:
    from seqkv.delta import RatePoint, run_default_sweep, run_quant_bench

    points: list[RatePoint] = []
    if not args.no_sweep:
        model = common.load_for(args)
        log = None if args.json else print
        points, _ = run_default_sweep(model, Path(args.reports), args.tokens, log=log)
    result = run_quant_bench(rate_distortion=points).to_json_dict()
    if args.json:
        print(json.dumps(result, default=str))
    else:
        Console().print_json(json.dumps(result["turboquant_mse"]))
        if points:
            print(f"rate-distortion table and plot written under {args.reports}/")
    return 0


def _cmd_bench_decode(args: argparse.Namespace) -> int:
    command = f"seqkv bench decode --tokens {args.tokens} --sessions {args.sessions}"
    texts, source = shipped_texts(), SHIPPED_TEXTS
    if args.texts:  # refused before the model loads
        if args.sessions:
            raise UsageError("the batched run cuts its sessions from the shipped texts, not from "
                             "--texts: pass --sessions 0 with --texts")
        texts = {Path(path).stem: common.read_text(path) for path in args.texts}
        if len(texts) != len(args.texts):
            raise UsageError("two --texts files have the same name: the report names texts by "
                             "file name")
        source = ", ".join(args.texts)
        command += " --texts " + " ".join(args.texts)
    model = common.load_for(args)
    if args.forwards_only:
        costs = asdict(forward_costs(model)) | {"model": model.name}
        common.print_figures(costs, args.json, "seqkv bench decode --forwards-only")
        return 0
    log = None if args.json else print
    levels = tuple(args.levels) if args.levels else DEFAULT_LEVELS
    if args.levels:
        command += " --levels " + " ".join(levels)
    bench = run_decode_bench(model, args.tokens, args.sessions, levels=levels, log=log,
                             texts=texts_tokens(model, texts, args.tokens), text_source=source)
    return _report(args, render_markdown(bench, command), bench.to_json_dict(), "decode levels")


def _report(args: argparse.Namespace, markdown: str, figures: dict[str, object],
            what: str) -> int:
    """Write a bench's markdown report to ``--report``; print its JSON (``--json``) or where."""
    target = Path(args.report)
    common.make_folder(target.parent)
    common.write_text(str(target), markdown)
    if args.json:
        print(json.dumps(figures | {"report": str(target)}, default=str))
    else:
        print(f"{what} written to {target}")
    return 0


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


def _cmd_bench_mix(args: argparse.Namespace) -> int:
    from seqkv.bench.mix import render_markdown, run_mix_bench

    model = common.load_for(args)
    log = None if args.json else print
    bench = run_mix_bench(model, dictionary_sessions=args.dictionary_sessions, seed=args.seed,
                          log=log)
    command = (f"seqkv bench mix --dictionary-sessions {args.dictionary_sessions} "
               f"--seed {args.seed}")
    return _report(args, render_markdown(bench, command), bench.to_json_dict(), "mixing report")


def _cmd_bench_store(args: argparse.Namespace) -> int:
    from seqkv.bench.store import StoreBenchConfig, run_store_bench

    model = common.load_for(args)
    config = StoreBenchConfig(sessions=args.sessions, scale_sessions=args.scale_sessions,
                              level=args.level)
    result = run_store_bench(model, config, workdir=args.workdir,
                             progress=common.reporter_of(args).sink,
                             parts=args.parts.split(","))
    figures = result.to_json_dict()
    if args.json:
        print(json.dumps(figures, default=str))
    else:
        Console().print_json(json.dumps(figures, default=str))
    return 0


STORE_PARTS = ("model", "scale", "throughput", "faults")


def _store_parts(text: str) -> str:
    parts = text.split(",")
    unknown = [part for part in parts if part not in STORE_PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(
            f"unknown part {', '.join(map(repr, unknown))}: choose from {', '.join(STORE_PARTS)}")
    return text


def add_bench(commands: common.Subparsers) -> None:
    bench = commands.add_parser("bench", help="measure a layer on a generated workload")
    benches = bench.add_subparsers(dest="bench", required=True)
    bt = benches.add_parser("trie", help="prefix trie vs vLLM-style hashed blocks")
    bt.add_argument("--seed", type=common.int_in(0, 2**63 - 1), default=0)
    common.json_option(bt)
    bt.set_defaults(run=_cmd_bench_trie)

    bq = benches.add_parser("quant", help="per-vector quantizers, and the rate-distortion sweep of "
                                         "predictive delta coding on the embedded model")
    common.model_option(bq)
    bq.add_argument("--no-sweep", action="store_true",
                    help="only the quantizers on random unit vectors (seconds, no model)")
    bq.add_argument("--tokens", type=common.int_in(2, 100_000), default=160,
                    help="cached tokens in the sweep")
    bq.add_argument("--reports", default="reports", type=common.output_folder,
                    help="folder for rate_distortion.md/.png")
    common.json_option(bq)
    common.progress_option(bq)
    bq.set_defaults(run=_cmd_bench_quant)

    bd = benches.add_parser("decode", help="bits per token and decode speed of every coding "
                                          "level, on prose, code, legal and technical text")
    common.model_option(bd)
    bd.add_argument("--tokens", type=common.int_in(2, 100_000), default=200,
                    help="tokens per text")
    bd.add_argument("--sessions", type=common.int_in(0, 4096), default=16,
                    help="sessions decoded as one batch (0: no batched run)")
    bd.add_argument("--texts", nargs="+", metavar="FILE", type=common.input_file_no_stdin,
                    help="texts to measure, named by file name (default: the shipped prose, "
                         "code, legal and technical texts); each needs --tokens tokens; "
                         "with --sessions 0")
    bd.add_argument("--levels", nargs="+", metavar="LEVEL", type=common.level_name,
                    help="levels to measure, in this order (default: every level)")
    bd.add_argument("--report", default="reports/decode_levels.md", metavar="PATH",
                    type=common.output_file_in_new_folder,
                    help="markdown Pareto table (default reports/decode_levels.md)")
    bd.add_argument("--forwards-only", action="store_true",
                    help="only the cost of one forward (1 row, 4 and 16 rows) and the probe of "
                         "which row counts give row-invariant matrix products (about a minute)")
    common.json_option(bd)
    common.progress_option(bd)
    bd.set_defaults(run=_cmd_bench_decode)

    bs = benches.add_parser("store", help="the session store on a generated multi-tenant chat "
                            "workload: bytes against fp16 KV, zstd -19 and one .skv per session; "
                            "the index at scale; throughput; a fault run")
    common.model_option(bs)
    bs.add_argument("--sessions", type=common.int_in(1, 1_000_000), default=200,
                    help="sessions coded with the model")
    bs.add_argument("--scale-sessions", type=common.int_in(1, 100_000_000), default=100_000,
                    help="sessions of the index-scale run (no model forwards)")
    bs.add_argument("--level", default="ngram", type=common.level_name,
                    help="level of the model run (default ngram)")
    bs.add_argument("--parts", default=",".join(STORE_PARTS), type=_store_parts,
                    help="comma-separated parts to run")
    bs.add_argument("--workdir", default="store-bench", metavar="DIR", type=common.output_folder,
                    help="scratch folder (stores and Redis servers)")
    common.json_option(bs)
    common.progress_option(bs)
    bs.set_defaults(run=_cmd_bench_store)

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

    bm = benches.add_parser("mix", help="the exact mixer with a dictionary on a RAG-style "
                            "workload: bits against the model alone, the dictionary's cost, the "
                            "mixer's cost per token")
    common.model_option(bm)
    bm.add_argument("--dictionary-sessions", type=common.int_in(1, 10_000), default=12,
                    help="sessions the dictionary is built from")
    bm.add_argument("--seed", type=common.int_in(0, 2**63 - 1), default=0)
    bm.add_argument("--report", default="reports/mixing.md", metavar="PATH",
                    type=common.output_file_in_new_folder,
                    help="markdown report (default reports/mixing.md)")
    common.json_option(bm)
    common.progress_option(bm)
    bm.set_defaults(run=_cmd_bench_mix)

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


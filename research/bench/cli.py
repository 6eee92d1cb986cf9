"""``python -m research.bench``: each layer measured on a generated workload.

These were the ``seqkv bench decode|mix|store|trie|quant`` verbs; ``layer1`` measures layer 1 on
the store. They measure (for the reports under ``reports/``) rather than serve, so they run
from a checkout, with the same argument checks and one-line errors as the ``seqkv`` command
(``seqkv.cli.main``); the regression gates stay in the package (``seqkv bench figures``,
``seqkv bench timing``).

    python -m research.bench decode --tokens 200 --sessions 16
    python -m research.bench mix --json
    python -m research.bench store --parts model,scale
    python -m research.bench trie --json
    python -m research.bench layer1 --sessions 200
    python -m research.bench quant --no-sweep --json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from seqkv import cli
from seqkv.cli import common
from seqkv.errors import UsageError
from seqkv.provenance import RunHeader, headed, start_run

PROG = "python -m research.bench"


def _cmd_trie(args: argparse.Namespace) -> int:
    from research.bench.trie import run_trie_bench

    result = run_trie_bench(seed=args.seed)
    common.print_figures(result.to_json_dict(), args.json,
                         f"{PROG} trie: generated multi-session workload")
    return 0


def _cmd_layer1(args: argparse.Namespace) -> int:
    from research.bench.layer1 import run_layer1
    from research.bench.trie import WorkloadSpec

    command = (f"{PROG} layer1 --sessions {args.sessions} --seed {args.seed} "
               f"--every {args.every} --report {args.report}")
    log = None if args.json else print
    rows = run_layer1(WorkloadSpec(sessions=args.sessions), args.seed, args.every,
                      Path(args.report), command, log)
    if args.json:
        print(json.dumps([{**asdict(r), "hit_rate": r.hit_rate, "kv_bytes": r.kv_bytes}
                          for r in rows[-2:]]))
    return 0


def _cmd_quant(args: argparse.Namespace) -> int:
    from research.bench.quant import run_quant_bench
    from research.bench.sweep import RatePoint, run_default_sweep

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


def _cmd_decode(args: argparse.Namespace) -> int:
    from research.bench.decode import (
        DEFAULT_LEVELS,
        SHIPPED_TEXTS,
        forward_costs,
        render_markdown,
        run_decode_bench,
        shipped_texts,
        texts_tokens,
    )

    command = f"{PROG} decode --tokens {args.tokens} --sessions {args.sessions}"
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
        common.print_figures(costs, args.json, f"{PROG} decode --forwards-only")
        return 0
    log = None if args.json else print
    levels = tuple(args.levels) if args.levels else DEFAULT_LEVELS
    if args.levels:
        command += " --levels " + " ".join(levels)
    header = start_run(model.name, f"{source}, first {args.tokens} tokens each", command)
    bench = run_decode_bench(model, args.tokens, args.sessions, levels=levels, log=log,
                             texts=texts_tokens(model, texts, args.tokens), text_source=source)
    return _report(args, render_markdown(bench, command), bench.to_json_dict(), "decode levels",
                   header)


def _report(args: argparse.Namespace, markdown: str, figures: dict[str, object],
            what: str, header: RunHeader) -> int:
    """Write a bench's markdown report, under the run's header, to ``--report``; print its JSON
    (``--json``) or where."""
    target = Path(args.report)
    common.make_folder(target.parent)
    common.write_text(str(target), headed(markdown, header.finished()))
    if args.json:
        print(json.dumps(figures | {"report": str(target)}, default=str))
    else:
        print(f"{what} written to {target}")
    return 0


def _cmd_mix(args: argparse.Namespace) -> int:
    from research.bench.mix import render_markdown, run_mix_bench

    model = common.load_for(args)
    log = None if args.json else print
    command = f"{PROG} mix --dictionary-sessions {args.dictionary_sessions} --seed {args.seed}"
    header = start_run(model.name, "RAG-style sessions generated from the shipped texts "
                                   f"(seed {args.seed})", command)
    bench = run_mix_bench(model, dictionary_sessions=args.dictionary_sessions, seed=args.seed,
                          log=log)
    return _report(args, render_markdown(bench, command), bench.to_json_dict(), "mixing report",
                   header)


def _cmd_store(args: argparse.Namespace) -> int:
    from research.bench.store import StoreBenchConfig, run_store_bench

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


def add_benches(benches: common.Subparsers) -> None:
    """The measurements, as verbs of their own."""
    bt = benches.add_parser("trie", help="prefix trie vs vLLM-style hashed blocks")
    bt.add_argument("--seed", type=common.int_in(0, 2**63 - 1), default=0)
    common.json_option(bt)
    bt.set_defaults(run=_cmd_trie)

    bl = benches.add_parser("layer1", help="layer 1 on the store: token-granular prefixes (its "
                            "trie) against hashed blocks, hit rate and bytes, row by row")
    bl.add_argument("--sessions", type=common.int_in(1, 1_000_000), default=200)
    bl.add_argument("--seed", type=common.int_in(0, 2**63 - 1), default=0)
    bl.add_argument("--every", type=common.int_in(1, 1_000_000), default=50,
                    help="sessions between report rows")
    bl.add_argument("--report", default="reports/store_layer1.md", metavar="PATH",
                    type=common.output_file_in_new_folder)
    common.json_option(bl)
    bl.set_defaults(run=_cmd_layer1)

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
    bq.set_defaults(run=_cmd_quant)

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
    bd.set_defaults(run=_cmd_decode)

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
    bs.set_defaults(run=_cmd_store)

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
    bm.set_defaults(run=_cmd_mix)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one measurement; exit status and errors as ``seqkv``'s."""
    return cli.main(argv, groups=(add_benches,), prog=PROG,
                    description="each layer of seqkv measured on a generated workload")

"""The ``seqkv`` command: compress, decompress, inspect, check and demo.

Every ``SeqKVError`` (bad input, damaged file, wrong model) ends the command with one line on
stderr and exit status 2, never a traceback. ``check`` exits 1 when a bound is violated. Output
files are written atomically, and ``compress`` writes its file only after a full decode has
verified it (unless ``--no-verify``).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import save_file

from seqkv.bench.decode import (
    forward_costs,
    render_markdown,
    run_decode_bench,
    time_token_by_token,
)
from seqkv.checker.run import CheckOptions
from seqkv.codec import (
    DEFAULT_TOLERANCE,
    CompressResult,
    DecompressResult,
    compress,
    decompress,
    decompress_tokens,
)
from seqkv.container import MAGIC, decode_container, write_container_file
from seqkv.errors import EmptyInputError, SeqKVError
from seqkv.levels import DEFAULT_LEVEL, CodingLevel, parse_level
from seqkv.models import CausalLM, load_default_model, load_model
from seqkv.proofs.ratios import per_vector_bits_per_token
from seqkv.schedule import pinned_threads

_QUANTIZER_BITS = 3  # the per-vector comparison point: TurboQuant at 3 bits per component


def _load(model_path: str | None) -> CausalLM:
    return load_default_model() if model_path is None else load_model(model_path)


def _read_text(path: str) -> str:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    if not text:
        raise EmptyInputError(f"{path} is empty: there is nothing to compress")
    return text


def _read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def _write_text(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    target = Path(path)
    temporary = target.with_name(f".{target.name}.seqkv-tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(target)


def compress_figures(
    model: CausalLM, result: CompressResult, verified: bool, verify_seconds: float | None
) -> dict[str, object]:
    """The JSON object ``seqkv compress --json`` prints."""
    stats = result.stats
    three_bit = float(per_vector_bits_per_token(model.geometry, _QUANTIZER_BITS))
    return {
        "model": model.name,
        "tokens": stats.tokens,
        "code_bits": stats.code_bits,
        "bits_per_token": stats.bits_per_token,
        "cross_entropy_bits_per_token": stats.cross_entropy_bits_per_token,
        "code_overhead_vs_cross_entropy": stats.code_bits / stats.cross_entropy_bits - 1,
        "residual_bits": stats.residual_bits,
        "residual_escapes": stats.residual_escapes,
        "total_bits_per_token": stats.total_bits_per_token,
        "file_bytes": stats.file_bytes,
        "kv_components_per_token": stats.kv_components_per_token,
        "fp16_bits_per_token": stats.fp16_bits_per_token,
        "ratio_vs_fp16": stats.ratio_vs_fp16,
        "per_vector_3bit_bits_per_token": three_bit,
        "ratio_vs_3bit_quantizer": three_bit / stats.total_bits_per_token,
        "tolerance": None if result.header.kv.residual is None
        else result.header.kv.residual.tolerance,
        "max_abs_kv_error": stats.max_abs_kv_error,
        "encode_seconds": stats.encode_seconds,
        "verify_seconds": verify_seconds,
        "verified": verified,
        "sections": result.sections,
        "bounds": [{"name": b.name, "bound": b.bound, "measured": b.measured, "holds": b.holds}
                   for b in result.bounds],
    }


def decompress_figures(result: DecompressResult) -> dict[str, object]:
    """The JSON object ``seqkv decompress --json`` prints."""
    stats = result.stats
    return {
        "tokens": stats.tokens,
        "decode_seconds": stats.decode_seconds,
        "decode_tokens_per_second": stats.tokens / stats.decode_seconds,
        "max_abs_residual": stats.max_abs_residual,
        "tolerance": None if result.header.kv.residual is None
        else result.header.kv.residual.tolerance,
        "tokens_verified": stats.tokens_verified,
        "kv_verified": stats.kv_verified,
        "verified": stats.verified,
    }


def _compress_and_verify(
    model: CausalLM, tokens: list[int], kv_mode: str, tolerance: float, verify: bool,
    level: CodingLevel | None = None,
) -> tuple[CompressResult, dict[str, object]]:
    kv = model.prefill(tokens) if kv_mode == "prefill" else None
    result = compress(model, tokens, kv=kv, tolerance=tolerance, progress=True,
                      level=level or parse_level(DEFAULT_LEVEL))
    verify_seconds = None
    if verify:
        started = time.perf_counter()
        decoded = decompress(model, result.data, progress=True)
        verify_seconds = time.perf_counter() - started
        assert decoded.tokens == tokens  # decompress already checked both checksums
    figures = compress_figures(model, result, verify, verify_seconds)
    figures["level"] = result.header.tokens.level if level is None else level.spec.name
    return result, figures


def _cmd_compress(args: argparse.Namespace) -> int:
    text = _read_text(args.text)
    model = _load(args.model)
    tokens = model.encode_text(text)
    result, figures = _compress_and_verify(model, tokens, args.kv, args.tolerance,
                                           not args.no_verify, args.level)
    write_container_file(args.output, result.data)
    _print(figures, args.json, f"compressed {args.text} -> {args.output}")
    return 0


def _cmd_decompress(args: argparse.Namespace) -> int:
    data = _read_bytes(args.file)
    container = decode_container(data)  # fail on a damaged file before loading the model
    if args.tokens_only:
        portable = container.header.tokens.level in ("ngram", "plain")
        tokens = decompress_tokens(data, None if portable else _load(args.model))
        _write_text(args.output, json.dumps(tokens) + "\n")
        return 0
    model = _load(args.model)
    result = decompress(model, data, allow_environment_mismatch=args.allow_environment_mismatch,
                        progress=True)
    _write_text(args.output, model.decode_tokens(result.tokens))
    if args.kv_out:
        kv = result.kv  # [L, 2, H, T, D]
        save_file(
            {"keys": kv[:, 0].contiguous(), "values": kv[:, 1].contiguous(),
             "tokens": torch.tensor(result.tokens, dtype=torch.int64)},
            args.kv_out,
            metadata={"model": model.name, "layout": "[layers, kv_heads, tokens, head_dim]"},
        )
    figures = decompress_figures(result)
    if args.output == "-" and not args.json:
        return 0
    _print(figures, args.json, f"decompressed {args.file} -> {args.output}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    data = _read_bytes(args.file)
    container = decode_container(data)
    header = asdict(container.header)
    header["file_bytes"] = len(data)
    header["token_code_bytes"] = len(container.token_code.data)
    header["residual_bytes"] = 0 if container.residual is None else (
        len(container.residual.words) + len(container.residual.escapes))
    if header["kv"]["residual"] is not None:
        del header["kv"]["residual"]["scales"]  # one float per (layer, K/V): noise in a summary
    _print(header, args.json, f"{args.file}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    # NOTE: imported here, not at the top: the checker is an optional reader of the core.
    from seqkv.checker import check_skv, check_text_tokens, render_markdown

    source = Path(args.input)
    options = CheckOptions(seed=args.seed, kv_positions=args.kv_positions,
                           entropy_contexts=args.entropy_contexts)
    data = _read_bytes(args.input)
    model = _load(args.model)
    baselines = Path(args.baselines)
    if data.startswith(MAGIC):
        report = check_skv(model, data, args.input, options, progress=True, baselines=baselines)
    else:
        tokens = model.encode_text(_read_text(args.input))
        report = check_text_tokens(model, tokens, args.input, args.tolerance, options,
                                   progress=True, baselines=baselines)
    target = Path(args.report) if args.report else Path("reports") / f"check-{source.stem}.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_text(str(target), render_markdown(report))
    if args.json:
        print(json.dumps(report.to_json_dict() | {"report": str(target)}, default=str))
    else:
        failed = [c.name for c in report.checks if c.kind == "bound" and not c.holds]
        verdict = "PASS" if report.passed else f"FAIL ({', '.join(failed)})"
        print(f"seqkv check: {verdict}; report written to {target}")
    return 0 if report.passed else 1


def _cmd_bench_trie(args: argparse.Namespace) -> int:
    from seqkv.trie import run_trie_bench

    result = run_trie_bench(seed=args.seed)
    _print(result.to_json_dict(), args.json, "seqkv bench trie: generated multi-session workload")
    return 0


def _cmd_bench_quant(args: argparse.Namespace) -> int:
    from seqkv.delta import RatePoint, run_default_sweep, run_quant_bench

    points: list[RatePoint] = []
    if not args.no_sweep:
        model = _load(args.model)
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
    model = _load(args.model)
    if args.forwards_only:
        costs = asdict(forward_costs(model)) | {"model": model.name}
        _print(costs, args.json, "seqkv bench decode --forwards-only")
        return 0
    log = None if args.json else print
    bench = run_decode_bench(model, args.tokens, args.sessions, log=log)
    command = f"seqkv bench decode --tokens {args.tokens} --sessions {args.sessions}"
    target = Path(args.report)
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_text(str(target), render_markdown(bench, command))
    if args.json:
        print(json.dumps(bench.to_json_dict() | {"report": str(target)}, default=str))
    else:
        print(f"decode levels written to {target}")
    return 0


def _cmd_bench_figures(args: argparse.Namespace) -> int:
    from seqkv.bench import figures as gate

    model = _load(args.model)
    key = gate.profile_key(model)
    path = gate.baseline_path(key, Path(args.baselines))
    current = gate.measure_figures(model)
    if args.record:
        gate.write_baseline(path, key, model, current)
        print(f"recorded {len(current)} rows of deterministic figures for profile {key} "
              f"in {path}")
        return 0
    changes = gate.compare_figures(gate.read_baseline(path), current)
    if args.json:
        print(json.dumps({"profile": key, "baseline": str(path), "passed": not changes,
                          "figures": [asdict(f) for f in current],
                          "changes": [asdict(c) for c in changes]}))
    elif changes:
        print(gate.render_changes(changes, key))
    else:
        print(f"seqkv bench figures: {len(current)} rows equal the baseline of profile {key}")
    return 1 if changes else 0


def _level_argument(text: str) -> CodingLevel:
    try:
        return parse_level(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@dataclass(frozen=True)
class DemoFigures:
    """What ``seqkv demo`` measures, beside the compress and decompress figures."""

    model_load_seconds: float
    prefill_seconds: float
    token_by_token_seconds: float


def _cmd_demo(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    model = _load(args.model)
    load_seconds = time.perf_counter() - started
    text = (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8")
    tokens = model.encode_text(text)
    started = time.perf_counter()
    model.prefill(tokens)
    prefill_seconds = time.perf_counter() - started
    result, figures = _compress_and_verify(model, tokens, "prefill", args.tolerance, False)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(args.output) if args.output else Path(folder) / "sample.skv"
        write_container_file(path, result.data)
        decoded = decompress(model, path.read_bytes(), progress=True)
    if decoded.tokens != tokens or model.decode_tokens(decoded.tokens) != model.decode_tokens(
        tokens
    ):
        raise SeqKVError("the demo's round trip did not reproduce the tokens")
    with pinned_threads():  # the decoder's thread count, so the two are comparable
        token_by_token = time_token_by_token(model, tokens)
    demo = DemoFigures(load_seconds, prefill_seconds, token_by_token)
    decode = decompress_figures(decoded)
    figures.update({f"decode_{k}" if k in ("tokens", "tolerance") else k: v
                    for k, v in decode.items()})
    figures["verified"] = decoded.stats.verified
    figures.update(asdict(demo))
    figures["encode_vs_prefill"] = result.stats.encode_seconds / prefill_seconds
    figures["decode_vs_token_by_token"] = decoded.stats.decode_seconds / token_by_token
    figures["text"] = "seqkv/data/sample.txt"
    figures["machine"] = (
        f"{os.cpu_count()} CPU cores ({platform.machine()}, "
        f"{torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}; coding and "
        f"token-by-token steps on 1 thread, prefill on {torch.get_num_threads()}"
    )
    _print(figures, args.json, "seqkv demo: the shipped sample text, round trip verified")
    return 0


def _print(figures: dict[str, object], as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(figures, default=str))
        return
    table = Table(title=title, show_header=False)
    for key, value in figures.items():
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    Console().print(table)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqkv", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def model_option(command: argparse.ArgumentParser) -> None:
        command.add_argument("--model", metavar="PATH", default=None,
                             help="local HF model folder or .gguf file (default: embedded "
                                  "SmolLM2-135M-Instruct)")

    c = commands.add_parser("compress", help="compress a text (and its prefill KV) to .skv")
    c.add_argument("text", metavar="TEXT", help="UTF-8 text file, or - for stdin")
    c.add_argument("-o", "--output", required=True, metavar="FILE.skv")
    model_option(c)
    c.add_argument("--kv", choices=["prefill", "none"], default="prefill",
                   help="store the KV of one prefill over the text (default) or tokens only")
    c.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"max abs KV error (default {DEFAULT_TOLERANCE}; 0 = bit-exact)")
    c.add_argument("--level", type=_level_argument, default=parse_level(DEFAULT_LEVEL),
                   metavar="LEVEL", help="rate-compute dial: tokens (default: fewest bits), rows "
                   "(same bits, fast encode, batched decoding), segments:N (N segments decoded "
                   "in parallel, more bits), ngram, plain (no model per token)")
    c.add_argument("--no-verify", action="store_true", help="skip the verifying decode")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(run=_cmd_compress)

    d = commands.add_parser("decompress", help="decode a .skv file to text (and KV)")
    d.add_argument("file", metavar="FILE.skv")
    d.add_argument("-o", "--output", required=True, metavar="TEXT", help="text file, or -")
    model_option(d)
    d.add_argument("--kv-out", metavar="KV.safetensors", help="also write the KV cache")
    d.add_argument("--tokens-only", action="store_true",
                   help="write the token ids as JSON, verified; ngram and plain files need no "
                        "model and decode on any machine")
    d.add_argument("--allow-environment-mismatch", action="store_true",
                   help="try to decode a file coded under other CPU kernels or library versions")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(run=_cmd_decompress)

    i = commands.add_parser("inspect", help="print a .skv file's header")
    i.add_argument("file", metavar="FILE.skv")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(run=_cmd_inspect)

    k = commands.add_parser("check", help="check the paper's bounds on a text or .skv file and "
                                         "write a markdown proof-check report")
    k.add_argument("input", metavar="TEXT|FILE.skv")
    model_option(k)
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

    bench = commands.add_parser("bench", help="measure a layer on a generated workload")
    benches = bench.add_subparsers(dest="bench", required=True)
    bt = benches.add_parser("trie", help="prefix trie vs vLLM-style hashed blocks")
    bt.add_argument("--seed", type=int, default=0)
    bt.add_argument("--json", action="store_true", help="print one JSON object")
    bt.set_defaults(run=_cmd_bench_trie)

    bq = benches.add_parser("quant", help="per-vector quantizers, and the rate-distortion sweep of "
                                         "predictive delta coding on the embedded model")
    model_option(bq)
    bq.add_argument("--no-sweep", action="store_true",
                    help="only the quantizers on random unit vectors (seconds, no model)")
    bq.add_argument("--tokens", type=int, default=160, help="cached tokens in the sweep")
    bq.add_argument("--reports", default="reports", help="folder for rate_distortion.md/.png")
    bq.add_argument("--json", action="store_true", help="print one JSON object")
    bq.set_defaults(run=_cmd_bench_quant)

    bd = benches.add_parser("decode", help="bits per token and decode speed of every coding "
                                          "level, on prose, code, legal and technical text")
    model_option(bd)
    bd.add_argument("--tokens", type=int, default=200, help="tokens per text")
    bd.add_argument("--sessions", type=int, default=16, help="sessions decoded as one batch")
    bd.add_argument("--report", default="reports/decode_levels.md", metavar="PATH",
                    help="markdown Pareto table (default reports/decode_levels.md)")
    bd.add_argument("--forwards-only", action="store_true",
                    help="only the cost of one forward (1 row, 4 and 16 rows) and the probe of "
                         "which row counts give row-invariant matrix products (about a minute)")
    bd.add_argument("--json", action="store_true", help="print one JSON object")
    bd.set_defaults(run=_cmd_bench_decode)

    bf = benches.add_parser("figures", help="deterministic figures of every level (code bits, "
                            "file bytes, residual bits, forwards) against the committed baseline "
                            "of this execution profile; exit 1 on any difference")
    model_option(bf)
    bf.add_argument("--record", action="store_true",
                    help="write this profile's baseline instead of comparing with it")
    bf.add_argument("--baselines", default=str(Path("benchmarks") / "baselines" / "figures"),
                    metavar="DIR", help="folder of the baselines (default "
                    "benchmarks/baselines/figures)")
    bf.add_argument("--json", action="store_true", help="print one JSON object")
    bf.set_defaults(run=_cmd_bench_figures)

    demo = commands.add_parser("demo", help="round trip of the shipped sample text, with figures")
    model_option(demo)
    demo.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    demo.add_argument("-o", "--output", metavar="FILE.skv", help="keep the .skv file here")
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.set_defaults(run=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except SeqKVError as error:
        print(f"seqkv: error: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"seqkv: error: no such file: {error.filename}", file=sys.stderr)
        return 2
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        print(f"seqkv: error: {error}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())

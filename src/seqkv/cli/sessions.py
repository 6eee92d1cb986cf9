"""The session-file verbs: ``compress``, ``decompress``, ``inspect``, ``upgrade`` and ``demo``."""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import platform
import struct
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save

from seqkv.bench.timing import time_token_by_token
from seqkv.cli import common
from seqkv.cli.dict import DictionaryFile
from seqkv.codec import DEFAULT_TOLERANCE, DecompressResult, PrefillKV, Theorem1, level_of
from seqkv.descriptions import Descriptions
from seqkv.errors import DecodeVerificationError, SeqKVError
from seqkv.formats.skv import SkvRead, read_skv
from seqkv.levels import DEFAULT_LEVEL, CodingLevel, parse_level
from seqkv.models import CausalLM
from seqkv.quantizers import TurboQuantMSE
from seqkv.schedule import pinned_threads
from seqkv.skv import CompressResult, compress, decompress, decompress_tokens, upgrade

_QUANTIZER_BITS = 3  # the per-vector comparison point: TurboQuant at 3 bits per component


def compress_figures(
    model: CausalLM, result: CompressResult, verified: bool, verify_seconds: float | None
) -> dict[str, object]:
    """The JSON object ``seqkv compress --json`` prints.

    Headline figures count every byte of the file (``file_bits_per_token``, ``ratio_vs_fp16``,
    ``ratio_vs_turboquant3``); payload-only figures are labelled ``payload_``. The 3-bit
    TurboQuant cost is what that quantizer stores for this KV (codes and fp16 norms), counted by
    ``seqkv.quantizers``, not a nominal 3 bits per component.
    """
    stats = result.stats
    positions = stats.tokens + stats.prefix_tokens
    shape = (model.num_layers, 2, model.kv_heads, positions, model.head_dim)
    turboquant = TurboQuantMSE(model.head_dim, _QUANTIZER_BITS).num_bits_for(shape) / positions
    return {
        "model": model.name,
        "level": result.session.level,
        "tokens": stats.tokens,
        "code_bits": stats.code_bits,
        "bits_per_token": stats.bits_per_token,
        "cross_entropy_bits_per_token": stats.cross_entropy_bits_per_token,
        "code_overhead_vs_cross_entropy": stats.code_bits / stats.cross_entropy_bits - 1,
        "residual_bits": stats.residual_bits,
        "residual_escapes": stats.residual_escapes,
        "payload_bits_per_token": stats.payload_bits_per_token,
        "file_bytes": stats.file_bytes,
        "file_bits_per_token": stats.file_bits_per_token,
        "kv_components_per_token": stats.kv_components_per_token,
        "fp16_bits_per_token": stats.fp16_bits_per_token,
        "ratio_vs_fp16": stats.ratio_vs_fp16,
        "payload_ratio_vs_fp16": stats.fp16_bits_per_token / stats.payload_bits_per_token,
        "turboquant3_bits_per_token": turboquant,
        "ratio_vs_turboquant3": turboquant / stats.file_bits_per_token,
        "tolerance": stats.tolerance,
        "max_abs_kv_error": stats.max_abs_kv_error,
        "encode_seconds": stats.encode_seconds,
        "verify_seconds": verify_seconds,
        "verified": verified,
        "sections": result.sections,
        "bounds": [{"name": b.name, "bound": b.bound, "measured": b.measured, "holds": b.holds}
                   for b in result.bounds],
        "theorem1": theorem1_figures(result.trace.theorem1()),
    }


def theorem1_figures(theorem1: Theorem1 | None) -> dict[str, object] | None:
    """Theorem 1's row: exact at every coded position (None at the model-free levels)."""
    if theorem1 is None:
        return None
    return {**asdict(theorem1), "mean_gap_bits": theorem1.mean_gap_bits, "exact": True,
            "top_positions": [list(p) for p in theorem1.top_positions]}


def decompress_figures(result: DecompressResult) -> dict[str, object]:
    """The JSON object ``seqkv decompress --json`` prints."""
    stats = result.stats
    return {
        "tokens": stats.tokens,
        "decode_seconds": stats.decode_seconds,
        "decode_tokens_per_second": stats.tokens / stats.decode_seconds,
        "max_abs_residual": stats.max_abs_residual,
        "tolerance": stats.tolerance,
        "tokens_verified": stats.tokens_verified,
        "kv_verified": stats.kv_verified,
        "verified": stats.verified,
    }


def _compress_and_verify(
    model: CausalLM, tokens: list[int], kv_mode: str, tolerance: float, verify: bool,
    level: CodingLevel | None = None, reporter: common.Reporter | None = None,
    dictionary: DictionaryFile | None = None,
) -> tuple[CompressResult, dict[str, object]]:
    reporter = reporter or common.Reporter(common.ProgressMode.OFF, sys.stderr)
    progress = reporter.sink
    model.check_tokens(tokens)  # the context's bound, before any forward
    # the caller's prefill runs inside the encoder, shared with its level and its reference
    kv: PrefillKV | None = "prefill" if kv_mode == "prefill" else None
    reporter.phase("encode")
    result = compress(model, tokens, kv=kv, tolerance=tolerance, progress=progress,
                      level=level or parse_level(DEFAULT_LEVEL),
                      dictionary=None if dictionary is None else dictionary.dictionary)
    verify_seconds = None
    if verify:
        reporter.phase("verify")
        started = time.perf_counter()
        decoded = decompress(model, result.data, progress=progress, dictionaries=dictionary)
        verify_seconds = time.perf_counter() - started
        if decoded.tokens != tokens:
            raise DecodeVerificationError("the verifying decode did not give back the tokens")
    figures = compress_figures(model, result, verify, verify_seconds)
    return result, figures


def _remember(result: CompressResult) -> None:
    """Keep the descriptions the file names by digest; a registry that cannot be written (a
    read-only home) costs only the detail of later refusals, so it is a warning."""
    descriptions = Descriptions()
    try:
        descriptions.remember(result.model_identity, result.profile)
    except OSError as error:
        print(f"seqkv: warning: cannot record the model and profile descriptions in "
              f"{descriptions.root}: {error.strerror or error}", file=sys.stderr)


def _load(args: argparse.Namespace) -> CausalLM:
    common.reporter_of(args).phase("load the model")
    return common.load_for(args)


def _cmd_compress(args: argparse.Namespace) -> int:
    reporter = common.reporter_of(args)
    model = _load(args)
    reporter.phase("read and tokenize the text")
    text = common.read_text(args.text, common.text_limit(model))
    tokens = model.encode_text(text)
    dictionary = DictionaryFile(args.dict) if args.dict else None
    result, figures = _compress_and_verify(model, tokens, args.kv, args.tolerance,
                                           not args.no_verify, args.level, reporter, dictionary)
    _remember(result)
    reporter.phase("write")
    common.write_outputs([(args.output, result.data)])
    common.print_figures(figures, args.json, f"compressed {args.text} -> {args.output}")
    return 0


def kv_file_bytes(kv: torch.Tensor, tokens: list[int], model_name: str) -> bytes:
    """The ``--kv-out`` safetensors file of a decoded KV ``[L, 2, H, T, D]``: the same bytes
    for the same KV in every process (``sorted_metadata``)."""
    data = save(
        {"keys": kv[:, 0].contiguous(), "values": kv[:, 1].contiguous(),
         "tokens": torch.tensor(tokens, dtype=torch.int64)},
        metadata={"model": model_name, "layout": "[layers, kv_heads, tokens, head_dim]"},
    )
    return sorted_metadata(data)


def sorted_metadata(data: bytes) -> bytes:
    """A safetensors file's bytes with its metadata keys in sorted order.

    safetensors writes the metadata from a hash map, in an order that changes from process to
    process (measured: four processes saving the same two keys wrote two orders), so one KV
    made files that differ in their header. The header keeps its length (the same JSON, keys
    reordered, padded as before), so the tensors' offsets hold. A header that would not fit
    (no such JSON here) is left as written."""
    (length,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + length])
    metadata = header.get("__metadata__")
    if not isinstance(metadata, dict):
        return data
    header["__metadata__"] = dict(sorted(metadata.items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(text) > length:
        return data
    return b"".join([data[:8], text.ljust(length, b" "), memoryview(data)[8 + length :]])


def _cmd_decompress(args: argparse.Namespace) -> int:
    reporter = common.reporter_of(args)
    data = common.read_bytes(args.file)
    read = read_skv(data)  # fail on a damaged file before loading the model
    if args.tokens_only:
        portable = not level_of(read.session).spec.model_coded
        model = None if portable else _load(args)
        reporter.phase("decode the tokens")
        tokens = decompress_tokens(data, model, max_tokens=args.max_tokens,
                                   max_memory_bytes=common.memory_limit(args))
        common.write_outputs([(args.output, (json.dumps(tokens) + "\n").encode())])
        return 0
    model = _load(args)
    reporter.phase("decode")
    result = decompress(model, data, allow_environment_mismatch=args.allow_environment_mismatch,
                        progress=reporter.sink, descriptions=Descriptions(),
                        require_exact_kv=args.require_exact_kv,
                        dictionaries=DictionaryFile(args.dict) if args.dict else None,
                        max_tokens=args.max_tokens, max_memory_bytes=common.memory_limit(args))
    outputs = [(args.output, model.decode_tokens(result.tokens).encode("utf-8"))]
    if args.kv_out:
        outputs.append((args.kv_out, kv_file_bytes(result.kv, result.tokens, model.name)))
    reporter.phase("write")
    common.write_outputs(outputs)
    figures = decompress_figures(result)
    if args.output == "-" and not args.json:
        return 0
    common.print_figures(figures, args.json, f"decompressed {args.file} -> {args.output}")
    return 0


def inspect_figures(read: SkvRead, file_bytes: int,
                    descriptions: Descriptions) -> dict[str, object]:
    """What ``seqkv inspect`` prints: the header's fields, the sections' sizes, and the full
    model and profile descriptions when the file carries them or the registry has them."""
    session = read.session
    residual = session.residual
    carried = read.model is not None
    model = read.model if carried else descriptions.model(session.model_digest)
    profile = read.profile if carried else descriptions.profile(session.profile_digest)
    return {
        "format_version": read.version,
        "level": session.level,
        "tokens": session.count,
        "segments": list(session.segments),
        "vocab_size": session.vocab_size,
        "model_digest": session.model_digest.hex(),
        "profile_digest": session.profile_digest.hex(),
        "tokens_digest": session.tokens_digest.hex(),
        "kv_digest": None if session.kv_digest is None else session.kv_digest.hex(),
        "prefix": None if session.prefix is None else {
            "prefix_hash": session.prefix.prefix_hash, "tokens": session.prefix.tokens,
            "kv_digest": session.prefix.kv_digest.hex()},
        "token_code_bits": session.token_code.num_bits,
        "residual": None if residual is None else {
            "mode": residual.mode.value, "tolerance": residual.tolerance,
            "bits": residual.num_bits, "escapes": residual.num_escapes},
        "file_bytes": file_bytes,
        "model": None if model is None else asdict(model),
        "profile": None if profile is None else asdict(profile),
        "descriptions": "in the file (format 1 or 2)" if carried
        else f"registry {descriptions.root}" if model is not None or profile is not None
        else f"not found in the registry {descriptions.root}",
    }


def _cmd_inspect(args: argparse.Namespace) -> int:
    data = common.read_bytes(args.file)
    figures = inspect_figures(read_skv(data), len(data), Descriptions())
    common.print_figures(figures, args.json, f"{args.file}")
    return 0


def _cmd_upgrade(args: argparse.Namespace) -> int:
    descriptions = Descriptions()
    rows = []
    model: CausalLM | None = None
    rewrites: list[tuple[str, bytes]] = []
    for name in dict.fromkeys(args.files):
        data = common.read_bytes(name)
        described = read_skv(data).profile  # formats 1 and 2 carry their profile
        if described is not None and described.schedule == "rows" and model is None:
            model = _load(args)  # the row block is calibrated on the model
        rewritten = upgrade(data, descriptions, model)
        if rewritten != data:
            rewrites.append((name, rewritten))
        rows.append({"file": name, "old_bytes": len(data), "new_bytes": len(rewritten),
                     "upgraded": rewritten != data})
    common.write_outputs(rewrites)  # every file read and rewritten before any is replaced
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            state = "rewritten" if row["upgraded"] else "already in a framed format"
            print(f"{row['file']}: {state}, {row['old_bytes']:,} -> {row['new_bytes']:,} bytes")
    return 0


@dataclass(frozen=True)
class DemoFigures:
    """What ``seqkv demo`` measures, beside the compress and decompress figures."""

    model_load_seconds: float
    prefill_seconds: float
    token_by_token_seconds: float


def _cmd_demo(args: argparse.Namespace) -> int:
    reporter = common.reporter_of(args)
    started = time.perf_counter()
    model = _load(args)
    load_seconds = time.perf_counter() - started
    text = (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8")
    tokens = model.encode_text(text)
    reporter.phase("prefill")
    started = time.perf_counter()
    model.prefill(tokens)
    prefill_seconds = time.perf_counter() - started
    result, figures = _compress_and_verify(model, tokens, "prefill", args.tolerance, False,
                                           reporter=reporter)
    with tempfile.TemporaryDirectory() as folder:
        path = args.output if args.output else str(Path(folder) / "sample.skv")
        common.write_outputs([(path, result.data)])
        reporter.phase("decode")
        decoded = decompress(model, common.read_bytes(path), progress=reporter.sink)
    if decoded.tokens != tokens or model.decode_tokens(decoded.tokens) != model.decode_tokens(
        tokens
    ):
        raise SeqKVError("the demo's round trip did not reproduce the tokens")
    reporter.phase("time token-by-token steps")
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
    common.print_figures(figures, args.json,
                         "seqkv demo: the shipped sample text, round trip verified")
    return 0


def add_session_verbs(commands: common.Subparsers) -> None:
    c = commands.add_parser("compress", help="compress a text (and its prefill KV) to .skv")
    c.add_argument("text", metavar="TEXT", type=common.input_file,
                   help="UTF-8 text file, or - for stdin")
    c.add_argument("-o", "--output", required=True, metavar="FILE.skv", type=common.output_file)
    common.model_option(c)
    c.add_argument("--kv", choices=["prefill", "none"], default="prefill",
                   help="store the KV of one prefill over the text (default) or tokens only")
    common.tolerance_option(c, DEFAULT_TOLERANCE)
    c.add_argument("--level", type=common.level_argument, default=parse_level(DEFAULT_LEVEL),
                   metavar="LEVEL", help="rate-compute dial: portable (default: integer "
                   "predictor, exact on any machine, decodes faster than token-by-token "
                   "generation), tokens (the float model, about portable's bits, much slower "
                   "to encode), rows (as tokens, fast encode, batched decoding), segments:N (N "
                   "segments decoded in parallel, more bits), ngram, plain (no model per "
                   "token), portable+mix (with --dict), portable4 (as portable, on the model's "
                   "4-bit weight blocks)")
    c.add_argument("--dict", metavar="DICT", type=common.input_file_no_stdin,
                   help="a mixing dictionary (seqkv dict build) for the portable+mix level")
    c.add_argument("--no-verify", action="store_true", help="skip the verifying decode")
    common.json_option(c)
    common.progress_option(c)
    c.set_defaults(run=_cmd_compress, paths=common.PathRoles(("text", "dict"), ("output",)))

    d = commands.add_parser("decompress", help="decode a .skv file to text (and KV)")
    d.add_argument("file", metavar="FILE.skv", type=common.input_file_no_stdin)
    d.add_argument("-o", "--output", required=True, metavar="TEXT",
                   type=common.output_file_or_stdout, help="text file, or -")
    common.model_option(d)
    d.add_argument("--kv-out", metavar="KV.safetensors", type=common.output_file,
                   help="also write the KV cache")
    d.add_argument("--tokens-only", action="store_true",
                   help="write the token ids as JSON, verified; ngram and plain files need no "
                        "model and decode on any machine")
    d.add_argument("--allow-environment-mismatch", action="store_true",
                   help="try to decode a file coded under other CPU kernels or library versions")
    d.add_argument("--require-exact-kv", action="store_true",
                   help="refuse a portable-level file coded under another execution profile "
                        "instead of returning its recomputed KV (kv_exact false)")
    d.add_argument("--dict", metavar="DICT", type=common.input_file_no_stdin,
                   help="the mixing dictionary a portable+mix file was coded with")
    common.decode_limit_options(d)
    common.json_option(d)
    common.progress_option(d)
    d.set_defaults(run=_cmd_decompress,
                   paths=common.PathRoles(("file", "dict"), ("output", "kv_out")))

    i = commands.add_parser("inspect", help="print a .skv file's header")
    i.add_argument("file", metavar="FILE.skv", type=common.input_file_no_stdin)
    common.json_option(i)
    i.set_defaults(run=_cmd_inspect)

    u = commands.add_parser("upgrade", help="rewrite .skv files of formats 1 and 2 in the "
                                           "framed format 4, in place, without re-coding")
    u.add_argument("files", metavar="FILE.skv", nargs="+", type=_upgradable)
    common.model_option(u)
    common.json_option(u, "one JSON array")
    common.progress_option(u)
    u.set_defaults(run=_cmd_upgrade)


def _upgradable(text: str) -> str:
    """A file ``upgrade`` can read and rewrite in place."""
    common.input_file_no_stdin(text)
    return common.output_file(text)


def add_demo(commands: common.Subparsers) -> None:
    demo = commands.add_parser("demo", help="round trip of the shipped sample text, with figures")
    common.model_option(demo)
    common.tolerance_option(demo, DEFAULT_TOLERANCE)
    demo.add_argument("-o", "--output", metavar="FILE.skv", type=common.output_file,
                      help="keep the .skv file here")
    common.json_option(demo)
    common.progress_option(demo)
    demo.set_defaults(run=_cmd_demo)

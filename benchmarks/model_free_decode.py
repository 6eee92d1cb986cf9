"""What the largest model-free decode the default caps allow costs, honest and forged.

The model-free levels (``ngram``, ``plain``) decode without the model, so no context bounds a
file's token count: ``seqkv.limits`` caps it (``MODEL_FREE_MAX_TOKENS``, ``MAX_MODEL_FREE_WORK``)
and the information guard stops a floored code (``.skv`` format 5, span records of version 3)
once it runs out, or before decoding where a token takes a known least number of bits
(``seqkv.levels.model_free`` invariant 3). This script codes sessions at the largest count the
caps allow at a vocabulary of 2 and of 49,152 (SmolLM2's), forges counts up to that cap, and
decodes each the two ways a user does without a model: ``decompress_tokens`` on a ``.skv`` file
and a tokens-only store's codec (``TokensCodec.decode_many`` on a span record). Each decode's
process CPU time is measured (the median of ``--repeats``), with how it ended.

Cases (the tokens are synthetic, seeded: no tokenizer is needed):

- ``honest bits``: independent fair bits (vocabulary 2);
- ``honest zipf``: Zipf(1.1) ranks over a random permutation of the vocabulary, as text's
  tokens are distributed; ``honest distinct``: every token new until the vocabulary is used up
  (the most tokens an ``ngram`` table can have seen);
- ``forged empty``: a format-5 file of no code whose count says the cap (the issue's 71-byte
  file); ``forged count``: a 16-token file whose count says the cap, in format 5 and 4 (no
  guard); ``forged noise``: a format-4 file of 64 KiB of random code whose count says the cap
  (an ``ngram`` decoder then meets new tokens at every position it can).

``--crossover`` also times one ``ngram`` table built with Python integers and with numpy arrays
over 8 to 256 tokens seen (``seqkv.coding.ngram.SMALL_SEEN``).

Usage: ``PYTHONPATH=src python benchmarks/model_free_decode.py [--vocabs 2 49152]
[--repeats 3] [--crossover] [--markdown reports/model_free_decode.md]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqkv.coding import ngram
from seqkv.coding.arithmetic import ArithmeticEncoder, BitStream
from seqkv.coding.ngram import AdaptiveNgram
from seqkv.digests import NO_PROFILE, tokens_digest
from seqkv.errors import SeqKVError
from seqkv.formats.skv import write_skv
from seqkv.formats.span import SpanRecord, read_span, write_span
from seqkv.levels import parse_level
from seqkv.levels.base import TraceColumns
from seqkv.levels.model_free import ModelFreeLevel, code_tokens
from seqkv.limits import MAX_MODEL_FREE_WORK, MODEL_FREE_MAX_TOKENS
from seqkv.provenance import RunHeader, start_run
from seqkv.session import CodedSession
from seqkv.skv import decompress_tokens
from seqkv.store.codec import SpanItem
from seqkv.store.codecs import TokensCodec

LEVELS = ("ngram", "plain")
NOISE_BYTES = 64 << 10


@dataclass(frozen=True)
class Row:
    level: str
    vocab: int
    case: str
    count: int
    code_bytes: int
    reader: str  # "file" (decompress_tokens) or "store" (TokensCodec)
    outcome: str  # "tokens" or the error's class
    cpu_seconds: float


def largest_count(level: ModelFreeLevel, vocab: int) -> int:
    """The most tokens a decode without a model allows at ``level`` (no prefix)."""
    low, high = 1, MODEL_FREE_MAX_TOKENS
    while low < high:
        middle = (low + high + 1) // 2
        if level.decode_work(vocab, middle, middle) <= MAX_MODEL_FREE_WORK:
            low = middle
        else:
            high = middle - 1
    return low


def tokens_of(case: str, vocab: int, count: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    if case == "bits":
        return [int(t) for t in rng.integers(0, vocab, count)]
    if case == "zipf":
        order = rng.permutation(vocab)
        return [int(order[(r - 1) % vocab]) for r in rng.zipf(1.1, count)]
    order = rng.permutation(vocab)  # distinct
    return [int(order[i % vocab]) for i in range(count)]


def coded(level: ModelFreeLevel, vocab: int, tokens: list[int]) -> CodedSession:
    encoder = ArithmeticEncoder()
    code_tokens(level, vocab, [], tokens, encoder, TraceColumns(with_entropy=False))
    return CodedSession(level=level.spec.name, count=len(tokens), segments=(len(tokens),),
                        vocab_size=vocab, model_digest=NO_PROFILE, profile_digest=NO_PROFILE,
                        tokens_digest=tokens_digest(tokens), kv_digest=NO_PROFILE, prefix=None,
                        dictionary=None, token_code=encoder.finish(), residual=None,
                        code_form="floored")


def forged(session: CodedSession, count: int, code: BitStream | None = None) -> CodedSession:
    return dataclasses.replace(session, count=count, segments=(count,),
                               token_code=session.token_code if code is None else code)


def cpu(call: Callable[[], object], repeats: int) -> tuple[str, float]:
    seconds, outcome = [], "tokens"
    for _ in range(repeats):
        started = time.process_time()
        try:
            call()
        except SeqKVError as error:
            outcome = type(error).__name__
        seconds.append(time.process_time() - started)
    return outcome, statistics.median(seconds)


def span_of(session: CodedSession, version: int) -> SpanRecord:
    """The session as a store keeps it: a version-3 record (floored code), or the bytes of a
    version-2 one (a format-4 session: no guard)."""
    record = SpanRecord(1, None, 0, True, session.count, session.tokens_digest, None, None, None,
                        session.token_code)
    if version == 3:
        return read_span(write_span(record))
    code = session.token_code
    return dataclasses.replace(record, token_code=BitStream(code.data, 8 * len(code.data)),
                               code_form="bytes")


def measure(level_name: str, vocab: int, repeats: int) -> list[Row]:
    level = parse_level(level_name)
    assert isinstance(level, ModelFreeLevel)
    cap = largest_count(level, vocab)
    honest = ["bits"] if vocab == 2 else ["zipf", "distinct"]
    sessions: list[tuple[str, CodedSession, int]] = []
    for case in honest:
        sessions.append((f"honest {case}", coded(level, vocab, tokens_of(case, vocab, cap)), 5))
    short = coded(level, vocab, tokens_of("bits" if vocab == 2 else "zipf", vocab, 16))
    sessions.append(("forged empty", forged(short, cap, BitStream(b"", 0)), 5))
    sessions.append(("forged count", forged(short, cap), 5))
    sessions.append(("forged count", forged(short, cap), 4))
    noise = np.random.default_rng(1).bytes(NOISE_BYTES)
    sessions.append(("forged noise", forged(short, cap, BitStream(noise, 8 * len(noise))), 4))
    rows = []
    codec = TokensCodec(vocab, level_name)
    for case, session, version in sessions:
        data = write_skv(session, version).data
        outcome, seconds = cpu(lambda d=data: decompress_tokens(d), repeats)
        name = f"{case} (format {version})"
        rows.append(Row(level_name, vocab, name, session.count, len(session.token_code.data),
                        "file", outcome, seconds))
        record = span_of(session, 3 if version == 5 else 2)
        outcome, seconds = cpu(lambda r=record: codec.decode_many([SpanItem(r, None)]), repeats)
        rows.append(Row(level_name, vocab, f"{case} (record {3 if version == 5 else 2})",
                        session.count, len(session.token_code.data), "store", outcome, seconds))
    return rows


def crossover(repeats: int) -> dict[int, tuple[float, float]]:
    """Microseconds per ``ngram`` table with Python integers and with numpy arrays, by tokens
    seen (vocabulary 49,152, a bigram and a trigram context as text has)."""
    out = {}
    kept = ngram.SMALL_SEEN
    for seen in (8, 16, 32, 64, 128, 256):
        tokens = tokens_of("distinct", 49152, seen) * 2
        models = []
        for small_seen in (seen, 0):  # Python lists throughout, numpy arrays from the first
            ngram.SMALL_SEEN = small_seen
            model = AdaptiveNgram(49152)
            for token in tokens:
                model.update(token)
            models.append(model)
        ngram.SMALL_SEEN = kept
        times: list[list[float]] = [[], []]
        for _ in range(repeats):
            for model, spent in zip(models, times, strict=True):
                started = time.process_time()
                for _ in range(2000):
                    model.table()
                spent.append((time.process_time() - started) / 2000 * 1e6)
        out[seen] = (statistics.median(times[0]), statistics.median(times[1]))
    return out


def markdown(rows: list[Row], cross: dict[int, tuple[float, float]] | None,
             header: RunHeader) -> str:
    lines = ["# Model-free decodes at the default caps", "",
             header.markdown(), "",
             f"Caps: {MODEL_FREE_MAX_TOKENS:,} tokens, work {MAX_MODEL_FREE_WORK:,} "
             "(`seqkv.limits`). "
             "CPU seconds of one decode (median).", "",
             "| level | vocab | case | count | code bytes | reader | ends in | CPU s |",
             "|---|---:|---|---:|---:|---|---|---:|"]
    lines += [f"| {r.level} | {r.vocab:,} | {r.case} | {r.count:,} | {r.code_bytes:,} | "
              f"{r.reader} | {r.outcome} | {r.cpu_seconds:.2f} |" for r in rows]
    if cross:
        lines += ["", "One `ngram` table, microseconds, by tokens seen (vocabulary 49,152):", "",
                  "| seen | Python ints | numpy |", "|---:|---:|---:|"]
        lines += [f"| {seen} | {a:.1f} | {b:.1f} |" for seen, (a, b) in cross.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[2, 49152])
    parser.add_argument("--levels", nargs="+", default=list(LEVELS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--crossover", action="store_true")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    header = start_run("none (the model-free levels)",
                       "generated codes at each level, vocabularies "
                       + ", ".join(f"{v:,}" for v in args.vocabs))
    rows = []
    for vocab in args.vocabs:
        for level in args.levels:
            for row in measure(level, vocab, args.repeats):
                print(json.dumps(dataclasses.asdict(row)), flush=True)
                rows.append(row)
    cross = crossover(args.repeats) if args.crossover else None
    text = markdown(rows, cross, header.finished())
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

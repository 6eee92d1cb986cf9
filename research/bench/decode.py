"""``python -m research.bench decode``: bits per token and decode speed of every coding level,
per text kind.

For each text kind (prose, code, legal, technical; shipped under ``seqkv/data``; or the texts
``--texts`` names, each needing at least ``--tokens`` tokens: a shorter one is refused, never
measured whole under a count it does not have) the same tokens are coded at every level of
``seqkv.levels`` and decoded, and the two plain baselines of the same model on the same tokens
are timed: one prefill, and token-by-token generation steps (transformers' forward, no coding,
on whichever of 1 or 2 threads is faster: the baseline is never handicapped).
Then ``batched_sessions`` sessions coded at the ``rows`` level decode together through
``seqkv.decompress_batch`` (``--sessions 0``: none); their aggregate tokens/s is compared with
the same baseline. When the
levels include ``portable``, the same sessions coded at ``portable`` are decoded together too
(``batched_by_level``): its batches need no canonical shape.

Every decode is checked against the originals: ``exact`` is true only when the decoded tokens
equal the input tokens and the decoded KV is within the tolerance of the input KV (bit-equal
at tolerance 0); ``decompress`` also verifies both checksums and raises otherwise. Timings are
wall-clock on whatever machine runs the bench; the JSON names it.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch
from transformers import DynamicCache

from seqkv.bench.texts import TEXT_FILES, shipped_text
from seqkv.bench.timing import time_token_by_token
from seqkv.codec import DEFAULT_TOLERANCE
from seqkv.errors import UsageError
from seqkv.formats.skv import read_skv
from seqkv.kvcache import tensor_from_cache
from seqkv.models.adapter import CausalLM, Stepper
from seqkv.models.rows import row_forward
from seqkv.schedule import pinned_threads, schedule_threads
from seqkv.skv import compress, decompress, decompress_batch

DEFAULT_LEVELS = ("tokens", "rows", "segments:4", "segments:8", "segments:16", "ngram", "plain",
                  "portable")
# NOTE: the portable level's encodes and the prefill they are compared with take the median of
# this many runs, interleaved (a prefill, an encode without the KV, one with it, then again):
# on this shared 2-core machine one run of a 200-token encode measured 0.25 to 1.1 s and the
# prefill 0.30 to 0.44 s within minutes (the VM's other tenants), so runs far apart in time
# compare the machine's moods, not the two computations. The float levels' encodes (up to
# tens of seconds) run once.
ENCODE_REPEATS = 5
SHIPPED_TEXTS = "the shipped prose, code, legal and technical samples"


@dataclass(frozen=True)
class LevelRun:
    name: str
    exact: bool
    bits_per_token: float  # token code only
    payload_bits_per_token: float  # token code + KV residual
    file_bits_per_token: float  # every byte of the file
    cross_entropy_bits_per_token: float  # of the probabilities this level coded under
    encode_seconds: float
    decode_seconds: float
    decode_tokens_per_second: float
    # a portable level's encode of the same tokens without the caller's KV (tokens only)
    encode_seconds_without_kv: float | None = None


@dataclass(frozen=True)
class TextRun:
    kind: str
    tokens: int
    cross_entropy_bits_per_token: float
    prefill_tokens_per_second: float
    token_by_token_tokens_per_second: float
    levels: list[LevelRun]


@dataclass(frozen=True)
class LevelSummary:
    name: str
    exact: bool
    bits_per_token: float
    payload_bits_per_token: float
    file_bits_per_token: float
    encode_tokens_per_second: float
    decode_tokens_per_second: float
    speedup_vs_token_by_token: float
    encode_tokens_per_second_without_kv: float | None = None  # portable levels only


@dataclass(frozen=True)
class BatchRun:
    sessions: int
    tokens_per_second: float
    speedup_vs_token_by_token: float
    exact: bool
    level: str = "rows"


@dataclass(frozen=True)
class SegmentCost:
    """What splitting one text into segments costs, against the same text in one sequence."""

    segments: int
    tokens_per_segment: float
    bits_per_token: float
    extra_bits_per_added_segment: float


@dataclass(frozen=True)
class DecodeBench:
    model: str
    machine: str
    tokens_per_text: int
    tolerance: float
    prefill_tokens_per_second: float
    token_by_token_tokens_per_second: float
    batched_sessions: int  # 0: no batched run (``--sessions 0``); the three below are then None
    batched_tokens_per_session: int
    batched_tokens_per_second: float | None
    batched_speedup_vs_token_by_token: float | None
    batched_exact: bool | None
    levels: list[LevelSummary]
    batched_more_sessions: list[BatchRun]  # the same measurement at other batch sizes
    segment_text_tokens: int  # the whole prose sample, for the segment costs
    segment_base_bits_per_token: float  # the same text in one sequence (rows level)
    segment_costs: list[SegmentCost]
    texts: list[TextRun] = field(default_factory=list)
    # the batched measurement at other levels than rows (``portable``), same sessions
    batched_by_level: list[BatchRun] = field(default_factory=list)
    text_source: str = SHIPPED_TEXTS  # what the texts are, for the report

    def to_json_dict(self) -> dict[str, object]:
        return asdict(self)


def kind_tokens(model: CausalLM, kind: str, count: int) -> list[int]:
    """At most ``count`` tokens of the shipped ``kind`` text (all of it when it is shorter)."""
    text = shipped_text(kind)
    return model.encode_text(text)[:count]


def texts_tokens(model: CausalLM, texts: Mapping[str, str], count: int) -> dict[str, list[int]]:
    """The first ``count`` tokens of each named text; a text with fewer is refused by name
    (the bench never measures a shorter text than the count it reports)."""
    out = {}
    for name, text in texts.items():
        tokens = model.encode_text(text)
        if len(tokens) < count:
            raise UsageError(
                f"the {name} text has {len(tokens):,} tokens, fewer than --tokens {count:,}: "
                "lower --tokens, or pass --texts with texts of at least that many tokens")
        out[name] = tokens[:count]
    return out


def shipped_texts() -> dict[str, str]:
    """The four shipped texts by kind, the bench's default texts."""
    return {kind: shipped_text(kind) for kind in TEXT_FILES}


def _token_by_token_seconds(model: CausalLM, tokens: Sequence[int]) -> float:
    """Generation's cost on these tokens, the faster of 1 and 2 threads."""
    best = float("inf")
    for threads in (1, 2):
        with pinned_threads(threads):
            best = min(best, time_token_by_token(model, tokens))
    return best


def _prefill_sample(model: CausalLM, tokens: list[int]) -> float:
    """Seconds of one prefill (as a serving engine's: the output layer for the last position
    only)."""
    with pinned_threads(max(2, torch.get_num_threads())):
        started = time.perf_counter()
        model.prefill(tokens)
        return time.perf_counter() - started


def _median(samples: Sequence[float]) -> float:
    return sorted(samples)[len(samples) // 2]


@dataclass(frozen=True)
class ForwardCosts:
    """What one forward costs, and the row-invariant forward's calibrated row block."""

    context_tokens: int
    transformers_step_ms: float  # one token, transformers, 1 thread
    rows_forward_ms: dict[int, float]  # rows per forward -> ms, row-invariant forward
    row_block: int  # products of fewer rows are padded to this many (calibrated on the machine)


@torch.inference_mode()
def forward_costs(model: CausalLM, context: int = 128, rows: Sequence[int] = (1, 4, 16),
                  repeats: int = 5) -> ForwardCosts:
    """Median cost of one forward after ``context`` tokens."""
    generator = torch.Generator().manual_seed(0)
    ids = [int(t) for t in torch.randint(3, model.vocab_size, (context,), generator=generator)]
    with pinned_threads():
        stepper = model.new_stepper()
        for token in ids:
            stepper.step(token)
        step = sorted(_step_seconds(stepper) for _ in range(repeats))[repeats // 2]
    engine = row_forward(model)
    costs: dict[int, float] = {}
    with pinned_threads(schedule_threads("rows")):
        for count in rows:
            sequences = [engine.new_sequence() for _ in range(count)]
            engine.forward([(s, ids) for s in sequences])
            samples = []
            for _ in range(repeats):
                started = time.perf_counter()
                engine.forward([(s, [ids[0]]) for s in sequences])
                samples.append(time.perf_counter() - started)
                for sequence in sequences:
                    sequence.crop(context)
            costs[count] = 1e3 * sorted(samples)[repeats // 2]
    return ForwardCosts(context, 1e3 * step, costs, engine.row_block)


def _step_seconds(stepper: Stepper) -> float:
    length = stepper.cache.get_seq_length()
    started = time.perf_counter()
    stepper.step(0)
    seconds = time.perf_counter() - started
    stepper.cache.crop(length)
    return seconds


def _exact(decoded_tokens: list[int], decoded_kv: torch.Tensor, tokens: list[int],
           kv: torch.Tensor, tolerance: float) -> bool:
    """Whether a decode gave back the original tokens, and the original KV within tolerance."""
    return decoded_tokens == tokens and bool((decoded_kv - kv).abs().max() <= tolerance)


def _codes_without_kv(level: str) -> bool:
    """Whether ``level`` codes tokens alone when given no KV (the portable levels)."""
    return level.partition(":")[0] == "portable"


def run_level(model: CausalLM, tokens: list[int], kv: DynamicCache, level: str,
              tolerance: float, prefill_samples: list[float]) -> LevelRun:
    """One level's run on ``tokens``; a portable level's repeated encodes are interleaved with
    prefills, whose seconds go to ``prefill_samples``."""
    result = compress(model, tokens, kv, tolerance=tolerance, level=level)
    started = time.perf_counter()
    decoded = decompress(model, result.data)
    seconds = time.perf_counter() - started
    exact = _exact(decoded.tokens, decoded.kv, tokens, tensor_from_cache(kv), tolerance)
    without_kv = None
    encode_seconds = result.stats.encode_seconds
    if _codes_without_kv(level):
        with_kv, alone = [encode_seconds], []
        for repeat in range(ENCODE_REPEATS):
            prefill_samples.append(_prefill_sample(model, tokens))
            coded = compress(model, tokens, tolerance=tolerance, level=level)
            alone.append(coded.stats.encode_seconds)
            # the same predictor codes the same tokens: the token code must not depend on the KV
            exact = exact and (read_skv(coded.data).session.token_code
                               == read_skv(result.data).session.token_code)
            if repeat + 1 < ENCODE_REPEATS:
                with_kv.append(compress(model, tokens, kv, tolerance=tolerance,
                                        level=level).stats.encode_seconds)
        encode_seconds, without_kv = _median(with_kv), _median(alone)
    stats = result.stats
    return LevelRun(level, exact, stats.bits_per_token, stats.payload_bits_per_token,
                    stats.file_bits_per_token, stats.cross_entropy_bits_per_token,
                    encode_seconds, seconds, len(tokens) / seconds, without_kv)


def run_text(model: CausalLM, kind: str, tokens: list[int], levels: Sequence[str],
             tolerance: float, log: Callable[[str], None] | None = None) -> TextRun:
    kv = model.prefill(tokens)
    for level in levels:  # warm-up: a level's first use builds its per-model state (the
        compress(model, tokens[:8], level=level)  # integer weights), counted no more than a load
    runs = []
    prefill_samples: list[float] = []
    for level in levels:
        runs.append(run_level(model, tokens, kv, level, tolerance, prefill_samples))
        if log is not None:
            run = runs[-1]
            log(f"{kind:10s} {level:12s} {run.bits_per_token:7.3f} bits/token "
                f"{run.decode_tokens_per_second:7.1f} tokens/s exact={run.exact}")
    full_rate = [r for r in runs if r.name in ("tokens", "rows")]
    cross_entropy = (full_rate[0].cross_entropy_bits_per_token if full_rate else
                     compress(model, tokens, level="rows").stats.cross_entropy_bits_per_token)
    if not prefill_samples:  # no portable level: the prefill alone
        prefill_samples = [_prefill_sample(model, tokens) for _ in range(ENCODE_REPEATS)]
    return TextRun(kind, len(tokens), cross_entropy,
                   len(tokens) / _median(prefill_samples),
                   len(tokens) / _token_by_token_seconds(model, tokens), runs)


def run_batched(model: CausalLM, sessions: int, count: int, tolerance: float,
                level: str = "rows", baseline: float | None = None) -> tuple[float, bool, float]:
    """Aggregate decode tokens/s of ``sessions`` files coded at ``level`` and decoded together,
    whether all were exact, and the token-by-token tokens/s on the same sessions (measured
    unless ``baseline`` gives it: the sessions depend only on ``sessions`` and ``count``)."""
    pool: list[int] = []
    for kind in TEXT_FILES:
        pool += kind_tokens(model, kind, 10_000)
    stride = max(1, (len(pool) - count) // max(1, sessions - 1))
    chunks = [pool[i * stride : i * stride + count] for i in range(sessions)]
    if any(len(chunk) != count for chunk in chunks):
        raise UsageError(f"the shipped texts hold {len(pool):,} tokens: too few for "
                         f"{sessions} sessions of {count:,} (lower --tokens or --sessions)")
    originals = [tensor_from_cache(model.prefill(c)) for c in chunks]
    files = [compress(model, c, kv, tolerance=tolerance, level=level)
             for c, kv in zip(chunks, originals, strict=True)]
    started = time.perf_counter()
    decoded = decompress_batch(model, [f.data for f in files])
    seconds = time.perf_counter() - started
    exact = all(_exact(d.tokens, d.kv, c, kv, tolerance)
                for d, c, kv in zip(decoded, chunks, originals, strict=True))
    if baseline is None:
        baseline = sum(len(c) for c in chunks[:2]) / sum(
            _token_by_token_seconds(model, c) for c in chunks[:2])
    return sum(len(c) for c in chunks) / seconds, exact, baseline


def segment_costs(model: CausalLM, counts: Sequence[int] = (2, 4, 8, 16, 32)
                  ) -> tuple[int, float, list[SegmentCost]]:
    """Token code of the whole prose sample at the rows level and in N segments (encode only)."""
    tokens = kind_tokens(model, "prose", 1 << 20)
    whole = compress(model, tokens, level="rows").stats.code_bits
    costs = []
    for count in counts:
        bits = compress(model, tokens, level=f"segments:{count}").stats.code_bits
        costs.append(SegmentCost(count, len(tokens) / count, bits / len(tokens),
                                 (bits - whole) / (count - 1)))
    return len(tokens), whole / len(tokens), costs


def run_decode_bench(model: CausalLM, tokens_per_text: int = 200, sessions: int = 16,
                     levels: Sequence[str] = DEFAULT_LEVELS, tolerance: float = DEFAULT_TOLERANCE,
                     log: Callable[[str], None] | None = None,
                     more_sessions: Sequence[int] = (4, 32),
                     texts: Mapping[str, list[int]] | None = None,
                     text_source: str = SHIPPED_TEXTS) -> DecodeBench:
    """Every level on each text's first ``tokens_per_text`` tokens (``texts``: tokens by name,
    default the shipped texts, ``texts_tokens``), then ``sessions`` sessions decoded as one
    batch (none when 0) and the segment costs."""
    if texts is None:
        texts = texts_tokens(model, shipped_texts(), tokens_per_text)
    if any(len(tokens) != tokens_per_text for tokens in texts.values()):
        raise UsageError(f"every text must hold exactly {tokens_per_text} tokens")
    texts_run = [run_text(model, kind, tokens, levels, tolerance, log)
                 for kind, tokens in texts.items()]
    total = sum(t.tokens for t in texts_run)
    prefill = total / sum(t.tokens / t.prefill_tokens_per_second for t in texts_run)
    baseline = total / sum(t.tokens / t.token_by_token_tokens_per_second for t in texts_run)
    summaries = []
    for index, level in enumerate(levels):
        runs = [t.levels[index] for t in texts_run]
        speed = total / sum(r.decode_seconds for r in runs)
        summaries.append(LevelSummary(
            level, all(r.exact for r in runs),
            sum(r.bits_per_token * t.tokens for r, t in zip(runs, texts_run, strict=True))
            / total,
            sum(r.payload_bits_per_token * t.tokens
                for r, t in zip(runs, texts_run, strict=True)) / total,
            sum(r.file_bits_per_token * t.tokens for r, t in zip(runs, texts_run, strict=True))
            / total, total / sum(r.encode_seconds for r in runs), speed, speed / baseline,
            None if any(r.encode_seconds_without_kv is None for r in runs) else
            total / sum(r.encode_seconds_without_kv or 0.0 for r in runs)))
    batched: float | None = None
    batched_exact: bool | None = None
    batched_speedup: float | None = None
    more = []
    by_level = []
    if sessions > 0:
        batched, batched_exact, batched_baseline = run_batched(model, sessions,
                                                               tokens_per_text, tolerance)
        batched_speedup = batched / batched_baseline
        if log is not None:
            log(f"batched {sessions} sessions: {batched:.1f} tokens/s exact={batched_exact}")
        for count in more_sessions:
            speed, exact, reference = run_batched(model, count, tokens_per_text, tolerance)
            more.append(BatchRun(count, speed, speed / reference, exact))
            batched_exact = batched_exact and exact
    if sessions > 0 and "portable" in levels:  # the same sessions: the same baseline
        speed, exact, _ = run_batched(model, sessions, tokens_per_text, tolerance, "portable",
                                      batched_baseline)
        if log is not None:
            log(f"batched {sessions} sessions at portable: {speed:.1f} tokens/s exact={exact}")
        by_level.append(BatchRun(sessions, speed, speed / batched_baseline, exact, "portable"))
    segment_tokens, segment_base, costs = segment_costs(model)
    machine = (f"{os.cpu_count()} CPU cores ({platform.machine()}, "
               f"{torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}")
    return DecodeBench(model.name, machine, tokens_per_text, tolerance, prefill, baseline,
                       sessions, tokens_per_text, batched, batched_speedup, batched_exact,
                       summaries, more, segment_tokens, segment_base, costs, texts_run,
                       by_level, text_source)


def _batched_line(bench: DecodeBench) -> str:
    if (bench.batched_tokens_per_second is None
            or bench.batched_speedup_vs_token_by_token is None):
        return "Batched: not run (`--sessions 0`)."
    return (
        f"Batched: {bench.batched_sessions} sessions of {bench.batched_tokens_per_session} tokens "
        f"at the rows level decoded together: {bench.batched_tokens_per_second:.1f} tokens/s in "
        f"all, {bench.batched_speedup_vs_token_by_token:.2f}x token-by-token generation of the "
        f"same sessions; exact: {'yes' if bench.batched_exact else 'NO'}. Other batch sizes: "
        + ", ".join(f"{m.sessions} sessions {m.tokens_per_second:.1f} tokens/s "
                    f"({m.speedup_vs_token_by_token:.2f}x)" for m in bench.batched_more_sessions)
        + ".")


def render_markdown(bench: DecodeBench, command: str) -> str:
    """The Pareto table of the levels, as README and reports/decode_levels.md show it."""
    lines = [
        "# Decoding levels: bits per token vs decode speed",
        "",
        f"Measured by `{command}`: model {bench.model}; texts: {bench.text_source}, first "
        f"{bench.tokens_per_text} tokens each; {bench.machine}; "
        f"KV residual tolerance {bench.tolerance:g}.",
        "",
        f"Baselines on the same tokens: one prefill {bench.prefill_tokens_per_second:.0f} "
        f"tokens/s; token-by-token generation {bench.token_by_token_tokens_per_second:.1f} "
        "tokens/s (transformers, the faster of 1 and 2 threads).",
        "",
        "Bits per token: the token code alone, with the KV residual (payload), and over every "
        "byte of the file (the headline figure).",
        "",
        "| level | exact | token bits/token | + KV residual | file bits/token | encode tokens/s "
        "| decode tokens/s | vs token-by-token |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for level in bench.levels:
        lines.append(
            f"| {level.name} | {'yes' if level.exact else 'NO'} | {level.bits_per_token:.3f} | "
            f"{level.payload_bits_per_token:.3f} | {level.file_bits_per_token:.3f} | "
            f"{level.encode_tokens_per_second:.1f} | "
            f"{level.decode_tokens_per_second:.1f} | {level.speedup_vs_token_by_token:.2f}x |")
    lines += [
        *(f"\nEncode at {level.name} against one prefill "
          f"({bench.prefill_tokens_per_second:.0f} tokens/s): with the caller's KV to code a "
          f"residual against {level.encode_tokens_per_second:.1f} tokens/s "
          f"({level.encode_tokens_per_second / bench.prefill_tokens_per_second:.2f}x); without "
          f"it (the tokens alone: no float model runs, the file records no KV) "
          f"{level.encode_tokens_per_second_without_kv:.1f} tokens/s "
          f"({level.encode_tokens_per_second_without_kv / bench.prefill_tokens_per_second:.2f}x)."
          f" Each of the three is the median of {ENCODE_REPEATS} runs per text, interleaved (a "
          "prefill, an encode without the KV, one with it, and again); the prefill, as a "
          "serving engine's, computes the output layer for the last position only."
          for level in bench.levels if level.encode_tokens_per_second_without_kv is not None),
        "",
        "Encode times stop where the file is written; the bounds every compress then checks (at "
        "portable, a float reference forward for the code-length bound) are not in them, at any "
        "level.",
        "",
        _batched_line(bench),
        *(f"\nThe same {m.sessions} sessions at the {m.level} level decoded together: "
          f"{m.tokens_per_second:.1f} tokens/s in all, {m.speedup_vs_token_by_token:.2f}x "
          f"token-by-token generation; exact: {'yes' if m.exact else 'NO'}."
          for m in bench.batched_by_level),
        "",
        f"Segment cost on the whole prose sample ({bench.segment_text_tokens} tokens, "
        f"{bench.segment_base_bits_per_token:.3f} bits/token in one sequence): every segment "
        "after the first restarts without context.",
        "",
        "| segments | tokens per segment | token bits/token | extra bits per added segment |",
        "|---:|---:|---:|---:|",
        *(f"| {c.segments} | {c.tokens_per_segment:.1f} | {c.bits_per_token:.3f} | "
          f"{c.extra_bits_per_added_segment:.1f} |" for c in bench.segment_costs),
        "",
        "Per text kind (token bits/token, decode tokens/s):",
        "",
        "| kind | tokens | cross-entropy | " + " | ".join(s.name for s in bench.levels) + " |",
        "|---|---:|---:|" + "---:|" * len(bench.levels),
    ]
    for text in bench.texts:
        cells = [f"{r.bits_per_token:.2f} / {r.decode_tokens_per_second:.0f}" for r in text.levels]
        lines.append(f"| {text.kind} | {text.tokens} | {text.cross_entropy_bits_per_token:.2f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

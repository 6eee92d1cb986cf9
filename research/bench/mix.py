"""``run_mix_bench``: what a store dictionary and the exact mixer save on a RAG-style workload.

The workload is generated from the texts seqkv ships (prose, code, legal, technical), split into
14 passages. Ten form a corpus of retrievable documents; four are "unique" text that no dictionary
session contains. A session is a fixed system prompt, two or three retrieved documents in varying
order under varying labels, a question and an answer. The dictionary is built from the tokens of
``dictionary_sessions`` such sessions with template answers. The measured sessions are others,
never the same ones: one RAG session per unique passage (the passage is its answer),
``template_sessions`` RAG sessions with template answers, and the unique passages alone (text
without useful dictionary content).

Every measured sequence is coded under the base model's per-position tables (one chunked forward
per sequence, tables computed once and reused by every mixer variant; the ``tokens`` level steps
token by token and its tables differ in the last bits, not in their cost), alone and through
``MixingPredictor``. Code lengths are the ideal sums of -log2(count / 2**32) under each table (the
arithmetic coder adds at most 2 bits per sequence). The first variant is the reported mixer; the
others are ablations. The same sessions are also coded with the ``ngram`` level's adaptive count
model as the base (a cheap integer base).

Also reported: the fraction of measured tokens that quote dictionary content (inside a span of
``QUOTE_SPAN`` or more tokens that occurs in the dictionary); the dictionary's size serialized,
through lzma, and coded under the model, with the model-coded size amortised over the measured
sessions and the number of such sessions that repays each size; the mixer's cost per token beside
one model step; and each shipped text coded with no dictionary at all (the session match on, as
nothing else can act), against the guarantee of at most 1.001x the base's code length + 16 bits.
"""

from __future__ import annotations

import lzma
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from seqkv.bench.texts import TEXT_FILES, shipped_text
from seqkv.coding.frequencies import cumulative_from_counts, table_and_log2p
from seqkv.coding.ngram import AdaptiveNgram
from seqkv.kvcache import with_cache
from seqkv.mixing.dictionary import Dictionary, build_dictionary
from seqkv.mixing.fixedpoint import FixedPoint
from seqkv.mixing.match import DictionaryIndex
from seqkv.mixing.mixer import MixerConfig, MixingPredictor
from seqkv.models.adapter import CausalLM
from seqkv.schedule import pinned_threads

QUOTE_SPAN = 16
GUARANTEE_FACTOR = 1.001
GUARANTEE_BITS = 16.0
# Passages (kind, index) that appear only in measured sessions: the unique text.
UNIQUE_PASSAGES = (("prose", 4), ("legal", 2), ("technical", 1), ("code", 3))
SYSTEM_PROMPT = ("You are a careful assistant. Answer the question using only the documents "
                 "below, and cite each document you use by its number.\n\n")
QUESTIONS = (
    "Which of these documents describes a procedure, and what is its first step?",
    "Summarise what the documents say about obligations and time limits.",
    "What changed over the years, according to the documents?",
    "Which document would help a new maintainer most, and why?",
    "List the numbers that appear in the documents and what each one measures.",
    "What should be checked at the end, according to the documents?",
)
TEMPLATE_ANSWERS = (
    "Answer: Document {n} covers this most directly; the others give background.",
    "Answer: See document {n}; it states the relevant details in its first paragraph.",
    "Answer: The documents do not agree fully, but document {n} is the most specific.",
)


@dataclass(frozen=True)
class Passage:
    kind: str
    index: int
    text: str

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"


@dataclass(frozen=True)
class Session:
    name: str
    text: str
    documents: tuple[str, ...]  # passage names retrieved into the session, in order
    unique: tuple[str, ...]  # passage names that no dictionary session holds


@dataclass(frozen=True)
class Workload:
    dictionary_sessions: tuple[Session, ...]
    measured_sessions: tuple[Session, ...]


def passages() -> list[Passage]:
    """The shipped texts split at blank lines; code blocks under 150 characters join the next."""
    result = []
    for kind in TEXT_FILES:
        blocks = [block.strip("\n") for block in shipped_text(kind).split("\n\n") if block.strip()]
        merged: list[str] = []
        carry = ""
        for block in blocks:
            carry = f"{carry}\n\n{block}" if carry else block
            if kind != "code" or len(carry) >= 150:
                merged.append(carry)
                carry = ""
        if carry:
            merged.append(carry)
        result += [Passage(kind, j, text) for j, text in enumerate(merged)]
    return result


def rag_workload(dictionary_sessions: int = 12, template_sessions: int = 3,
                 seed: int = 0) -> Workload:
    """The generated workload (deterministic for a seed).

    Measured: one RAG session per unique passage (the passage is its answer), then
    ``template_sessions`` RAG sessions with template answers, then the unique passages alone.
    """
    rng = random.Random(seed)
    everything = passages()
    unique = [p for p in everything if (p.kind, p.index) in UNIQUE_PASSAGES]
    corpus = [p for p in everything if (p.kind, p.index) not in UNIQUE_PASSAGES]
    draws: list[Passage] = []

    def retrieve(count: int) -> list[Passage]:
        chosen: list[Passage] = []
        while len(chosen) < count:
            if not draws:
                draws.extend(rng.sample(corpus, len(corpus)))
            candidate = draws.pop()
            if candidate not in chosen:
                chosen.append(candidate)
        return chosen

    def session(name: str, documents: list[Passage], answer: str,
                answer_unique: tuple[str, ...]) -> Session:
        parts = [SYSTEM_PROMPT]
        parts += [f"Document {n + 1}:\n{p.text}\n\n" for n, p in enumerate(documents)]
        parts.append(f"Question: {rng.choice(QUESTIONS)}\n{answer}\n")
        return Session(name, "".join(parts), tuple(p.name for p in documents), answer_unique)

    built = []
    for j in range(dictionary_sessions):
        documents = retrieve(3)
        answer = rng.choice(TEMPLATE_ANSWERS).format(n=rng.randrange(1, 4))
        built.append(session(f"sample-{j}", documents, answer, ()))
    measured = []
    for j, passage in enumerate(unique):
        documents = retrieve(rng.choice((2, 3)))
        measured.append(session(f"rag-{j}", documents, f"Answer: {passage.text}",
                                (passage.name,)))
    for j in range(template_sessions):
        documents = retrieve(rng.choice((2, 3)))
        answer = rng.choice(TEMPLATE_ANSWERS).format(n=rng.randrange(1, len(documents) + 1))
        measured.append(session(f"rag-template-{j}", documents, answer, ()))
    measured.append(Session("unique-only", "\n\n".join(p.text for p in unique) + "\n", (),
                            tuple(p.name for p in unique)))
    return Workload(tuple(built), tuple(measured))


def quoted_tokens(dictionary: Dictionary, tokens: Sequence[int], span: int = QUOTE_SPAN) -> int:
    """How many ``tokens`` lie inside a run of ``span`` or more tokens found in the dictionary."""
    content = dictionary.tokens.tolist()
    windows: dict[tuple[int, ...], list[int]] = {}
    for start in range(len(content) - span + 1):
        windows.setdefault(tuple(content[start : start + span]), []).append(start)
    covered = np.zeros(len(tokens), dtype=bool)
    for i in range(len(tokens) - span + 1):
        if tuple(tokens[i : i + span]) in windows:
            covered[i : i + span] = True
    return int(covered.sum())


class BaseTables:
    """Per-position base tables of one sequence, kept as uint32 counts (4 bytes per entry)."""

    def __init__(self, counts: npt.NDArray[np.uint32]) -> None:
        self.counts = counts  # [T, V]

    def __len__(self) -> int:
        return int(self.counts.shape[0])

    def table(self, position: int) -> npt.NDArray[np.int64]:
        cumulative = np.zeros(self.counts.shape[1] + 1, dtype=np.int64)
        np.cumsum(self.counts[position], out=cumulative[1:])
        return cumulative

    def bits(self, tokens: Sequence[int]) -> float:
        picked = self.counts[np.arange(len(tokens)), np.asarray(tokens)].astype(np.float64)
        return float((32.0 - np.log2(picked)).sum())


@torch.inference_mode()
def model_tables(model: CausalLM, tokens: Sequence[int], chunk: int = 256) -> BaseTables:
    """The model's table for each position: position 0 after the start token (or uniform)."""
    vocab = model.vocab_size
    counts = np.zeros((len(tokens), vocab), dtype=np.uint32)
    start = model.start_token_id
    inputs = ([start] if start is not None else []) + list(tokens[:-1])
    offset = 0 if start is not None else 1
    if start is None:
        counts[0] = np.diff(cumulative_from_counts(np.ones(vocab, dtype=np.int64)))
    cache = DynamicCache()
    for begin in range(0, len(inputs), chunk):
        ids = torch.tensor([inputs[begin : begin + chunk]], dtype=torch.long)  # [1, C]
        logits = model.model(input_ids=ids, **with_cache(model.model, cache),
                             use_cache=True).logits[0]  # [C, V]
        rows = logits.float().numpy()
        for r in range(rows.shape[0]):
            counts[offset + begin + r] = np.diff(table_and_log2p(rows[r])[0])
    return BaseTables(counts)


def ngram_tables(vocab: int, tokens: Sequence[int]) -> BaseTables:
    """The ``ngram`` level's tables (``AdaptiveNgram``) for each position."""
    model = AdaptiveNgram(vocab)
    counts = np.zeros((len(tokens), vocab), dtype=np.uint32)
    for position, token in enumerate(tokens):
        counts[position] = np.diff(cumulative_from_counts(model.weights()))
        model.update(token)
    return BaseTables(counts)


@dataclass(frozen=True)
class MixRun:
    bits: float
    seconds: float  # mixer only: table + update, base tables excluded


def run_mixer(predictor: MixingPredictor, base: BaseTables, tokens: Sequence[int]) -> MixRun:
    bits = 0.0
    seconds = 0.0
    for position, token in enumerate(tokens):
        table = base.table(position)
        started = time.perf_counter()
        mixed = predictor.table(table)
        predictor.update(token)
        seconds += time.perf_counter() - started
        bits += 32.0 - float(np.log2(int(mixed[token + 1] - mixed[token])))
    return MixRun(bits, seconds)


@dataclass(frozen=True)
class SessionResult:
    name: str
    base: Literal["model", "ngram"]
    tokens: int
    quoted_fraction: float
    base_bits_per_token: float
    mixed_bits_per_token: float
    ratio: float  # mixed / base code length
    within_guarantee: bool  # mixed <= 1.001 * base + 16 bits


@dataclass(frozen=True)
class VariantResult:
    """One mixer configuration over all measured sessions (model base)."""

    name: str
    bits_per_token: float
    quoting_bits_per_token: float  # over the sessions that quote the dictionary
    other_bits_per_token: float  # over the sessions that do not


@dataclass(frozen=True)
class TextResult:
    kind: str
    tokens: int
    model_bits_per_token: float
    mixed_bits_per_token: float  # no dictionary, the first variant with the session match on
    ratio: float
    within_guarantee: bool


@dataclass(frozen=True)
class DictionaryCost:
    """The dictionary's size three ways, and what it costs amortised over the measured sessions."""

    sample_tokens: int  # tokens of the sessions it was built from
    tokens: int
    serialized_bytes: int
    lzma_bytes: int  # the serialized bytes through lzma (preset 9)
    model_coded_bits: float  # its tokens coded under the model, one sequence (+2 bits flush)
    bits_per_measured_token: float  # model-coded size over the measured tokens
    break_even_sessions_serialized: float  # measured-like sessions that repay the raw bytes
    break_even_sessions_model_coded: float


@dataclass(frozen=True)
class MixBench:
    model: str
    machine: str
    dictionary_sessions: int
    dictionary_digest: str
    dictionary: DictionaryCost
    measured_sessions: int
    measured_tokens: int
    quoted_fraction: float  # measured tokens inside a QUOTE_SPAN-token run of the dictionary
    model_bits_per_token: float
    mixed_bits_per_token: float
    quoting_model_bits_per_token: float  # over the sessions that quote the dictionary
    quoting_mixed_bits_per_token: float
    gain: float  # 1 - mixed / model over the measured sessions
    gain_with_dictionary: float  # 1 - (mixed + model-coded dictionary) / model
    ngram_bits_per_token: float  # the ngram level's model as the base, same sessions
    ngram_mixed_bits_per_token: float
    mixer_ms_per_token: float  # table + update, model base, 49,152-token tables
    model_step_ms: float  # one transformers step at 128 tokens of context, 1 thread
    sessions: list[SessionResult]
    variants: list[VariantResult]
    texts: list[TextResult]

    def to_json_dict(self) -> dict[str, object]:
        return asdict(self)


DEFAULT_VARIANTS: tuple[tuple[str, MixerConfig], ...] = (
    ("default", MixerConfig()),
    ("with-apm", MixerConfig(apm=True)),
    ("no-dictionary-ngram", MixerConfig(dictionary_ngram=False)),
    ("with-session-match", MixerConfig(session_match=True)),
    ("min-match-4", MixerConfig(min_match=4)),
)


def _within(mixed: float, base: float) -> bool:
    return mixed <= GUARANTEE_FACTOR * base + GUARANTEE_BITS


def _model_step_ms(model: CausalLM, context: int = 128, repeats: int = 5) -> float:
    generator = torch.Generator().manual_seed(0)
    ids = [int(t) for t in torch.randint(3, model.vocab_size, (context,), generator=generator)]
    with pinned_threads(1):
        stepper = model.new_stepper()
        for token in ids[:-repeats]:
            stepper.step(token)
        samples = []
        for token in ids[-repeats:]:
            started = time.perf_counter()
            stepper.step(token)
            samples.append(time.perf_counter() - started)
    return 1e3 * sorted(samples)[repeats // 2]


@dataclass
class _Totals:
    tokens: int = 0
    quoted: int = 0
    model: float = 0.0
    ngram: float = 0.0
    ngram_mixed: float = 0.0
    quoting_tokens: int = 0
    quoting_model: float = 0.0
    mixer_seconds: float = 0.0


def run_mix_bench(model: CausalLM, dictionary_sessions: int = 12, template_sessions: int = 3,
                  seed: int = 0, variants: Sequence[tuple[str, MixerConfig]] = DEFAULT_VARIANTS,
                  texts: Sequence[str] = tuple(TEXT_FILES),
                  encode: Callable[[str], list[int]] | None = None,
                  max_tokens: int | None = None,
                  log: Callable[[str], None] | None = None) -> MixBench:
    """Run the workload (see the module docstring); the first variant is the reported mixer.

    ``encode`` turns text into tokens (default: the model's tokenizer); ``max_tokens`` cuts every
    sequence (for quick runs).
    """
    say = log or (lambda _: None)
    tokenize = encode or model.encode_text

    def tokens_of(text: str) -> list[int]:
        return tokenize(text)[:max_tokens]

    workload = rag_workload(dictionary_sessions, template_sessions, seed)
    vocab = model.vocab_size
    sample = [tokens_of(s.text) for s in workload.dictionary_sessions]
    dictionary = build_dictionary(sample, vocab, namespace="bench")
    fixed = FixedPoint.build()
    indexes: dict[int, DictionaryIndex] = {}

    def predictor(config: MixerConfig, with_dictionary: bool = True) -> MixingPredictor:
        if not with_dictionary:
            return MixingPredictor(None, vocab, config, fixed)
        if config.min_match not in indexes:
            indexes[config.min_match] = DictionaryIndex(dictionary, config.min_match)
        return MixingPredictor(indexes[config.min_match], vocab, config, fixed)

    sessions: list[SessionResult] = []
    variant_bits = {name: [0.0, 0.0] for name, _ in variants}  # quoting, other sessions
    totals = _Totals()
    for session in workload.measured_sessions:
        tokens = tokens_of(session.text)
        quoted = quoted_tokens(dictionary, tokens)
        fraction = quoted / len(tokens)
        tables = model_tables(model, tokens)
        model_bits = tables.bits(tokens)
        for j, (name, config) in enumerate(variants):
            run = run_mixer(predictor(config), tables, tokens)
            variant_bits[name][0 if quoted else 1] += run.bits
            if j == 0:
                totals.mixer_seconds += run.seconds
                sessions.append(SessionResult(
                    session.name, "model", len(tokens), fraction, model_bits / len(tokens),
                    run.bits / len(tokens), run.bits / model_bits, _within(run.bits, model_bits)))
                say(f"{session.name:16s} {len(tokens):4d} tokens quoted {fraction:5.1%} model "
                    f"{model_bits / len(tokens):6.3f} mixed {run.bits / len(tokens):6.3f} "
                    "bits/token")
        del tables
        ngram = ngram_tables(vocab, tokens)
        ngram_bits = ngram.bits(tokens)
        ngram_run = run_mixer(predictor(variants[0][1]), ngram, tokens)
        sessions.append(SessionResult(
            session.name, "ngram", len(tokens), fraction, ngram_bits / len(tokens),
            ngram_run.bits / len(tokens), ngram_run.bits / ngram_bits,
            _within(ngram_run.bits, ngram_bits)))
        totals.tokens += len(tokens)
        totals.quoted += quoted
        totals.model += model_bits
        totals.ngram += ngram_bits
        totals.ngram_mixed += ngram_run.bits
        if quoted:
            totals.quoting_tokens += len(tokens)
            totals.quoting_model += model_bits
    count = totals.tokens
    quoting_count = max(1, totals.quoting_tokens)
    other_count = max(1, count - totals.quoting_tokens)
    variant_results = [VariantResult(name, (bits[0] + bits[1]) / count, bits[0] / quoting_count,
                                     bits[1] / other_count)
                       for name, bits in variant_bits.items()]
    texts_results = []
    for kind in texts:
        tokens = tokens_of(shipped_text(kind))
        tables = model_tables(model, tokens)
        model_bits = tables.bits(tokens)
        # Without a dictionary the session match is the only predictor left to act.
        alone = replace(variants[0][1], session_match=True)
        run = run_mixer(predictor(alone, with_dictionary=False), tables, tokens)
        del tables
        texts_results.append(TextResult(kind, len(tokens), model_bits / len(tokens),
                                        run.bits / len(tokens), run.bits / model_bits,
                                        _within(run.bits, model_bits)))
        say(f"{kind:16s} {len(tokens):4d} tokens model {model_bits / len(tokens):6.3f} "
            f"mixed {run.bits / len(tokens):6.3f} bits/token (no dictionary)")
    mixed_total = sum(variant_bits[variants[0][0]])
    content = dictionary.tokens.tolist()
    coded_bits = model_tables(model, content).bits(content) + 2.0
    saved_per_session = (totals.model - mixed_total) / len(workload.measured_sessions)

    def sessions_to_repay(bits: float) -> float:
        return bits / saved_per_session if saved_per_session > 0 else float("inf")

    cost = DictionaryCost(
        sample_tokens=sum(len(s) for s in sample),
        tokens=len(dictionary),
        serialized_bytes=dictionary.size_bytes,
        lzma_bytes=len(lzma.compress(dictionary.to_bytes(), preset=9)),
        model_coded_bits=coded_bits,
        bits_per_measured_token=coded_bits / count,
        break_even_sessions_serialized=sessions_to_repay(8.0 * dictionary.size_bytes),
        break_even_sessions_model_coded=sessions_to_repay(coded_bits),
    )
    return MixBench(
        model=model.name,
        machine=f"{platform.machine()} {platform.processor() or platform.system()}, "
                f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads",
        dictionary_sessions=dictionary_sessions,
        dictionary_digest=dictionary.digest,
        dictionary=cost,
        measured_sessions=len(workload.measured_sessions),
        measured_tokens=count,
        quoted_fraction=totals.quoted / count,
        model_bits_per_token=totals.model / count,
        mixed_bits_per_token=mixed_total / count,
        quoting_model_bits_per_token=totals.quoting_model / quoting_count,
        quoting_mixed_bits_per_token=variant_bits[variants[0][0]][0] / quoting_count,
        gain=1.0 - mixed_total / totals.model,
        gain_with_dictionary=1.0 - (mixed_total + coded_bits) / totals.model,
        ngram_bits_per_token=totals.ngram / count,
        ngram_mixed_bits_per_token=totals.ngram_mixed / count,
        mixer_ms_per_token=1e3 * totals.mixer_seconds / count,
        model_step_ms=_model_step_ms(model),
        sessions=sessions,
        variants=variant_results,
        texts=texts_results,
    )


def render_markdown(bench: MixBench, command: str) -> str:
    """The bench as a markdown report (``python -m research.bench mix`` writes it to
    reports/mixing.md)."""
    cost = bench.dictionary
    lines = [
        "# Mixing: the model with a dictionary's predictors, exactly", "",
        f"Measured by `{command}`. Model: {bench.model}. Machine: {bench.machine}. Workload: "
        "RAG-style sessions generated from the shipped texts (see `research/bench/mix.py`); the "
        f"dictionary is built from {bench.dictionary_sessions} sessions, the "
        f"{bench.measured_sessions} measured sessions ({bench.measured_tokens:,} tokens) are "
        f"others; {bench.quoted_fraction:.1%} of the measured tokens quote the dictionary "
        f"(runs of {QUOTE_SPAN}+ tokens). Code lengths are ideal sums of -log2 p under each "
        "integer table (the coder adds at most 2 bits per sequence).", "",
        "| | model alone | mixed | mixed / model |", "|---|---:|---:|---:|",
        f"| sessions that quote the dictionary | {bench.quoting_model_bits_per_token:.3f} | "
        f"{bench.quoting_mixed_bits_per_token:.3f} | "
        f"{bench.quoting_mixed_bits_per_token / bench.quoting_model_bits_per_token:.3f}x |",
        f"| all measured sessions | {bench.model_bits_per_token:.3f} | "
        f"{bench.mixed_bits_per_token:.3f} | "
        f"{bench.mixed_bits_per_token / bench.model_bits_per_token:.3f}x |",
        f"| all, ngram base | {bench.ngram_bits_per_token:.3f} | "
        f"{bench.ngram_mixed_bits_per_token:.3f} | "
        f"{bench.ngram_mixed_bits_per_token / bench.ngram_bits_per_token:.3f}x |", "",
        f"Gain over the model: {bench.gain:.1%}; with the dictionary's model-coded size "
        f"({cost.model_coded_bits:,.0f} bits) charged to these sessions: "
        f"{bench.gain_with_dictionary:.1%}. Dictionary: {cost.tokens:,} tokens, "
        f"{cost.serialized_bytes:,} bytes serialized ({cost.lzma_bytes:,} through lzma); repaid "
        f"by {cost.break_even_sessions_serialized:.1f} sessions like these at its serialized size. "
        f"Mixer: {bench.mixer_ms_per_token:.2f} ms per token against "
        f"{bench.model_step_ms:.1f} ms for one model step (1 thread).", "",
        "Texts without a dictionary (the mixer must not cost more than 1.001x + 16 bits):", "",
        "| text | tokens | model bits/token | mixed bits/token | ratio | within |",
        "|---|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {t.kind} | {t.tokens} | {t.model_bits_per_token:.4f} | "
              f"{t.mixed_bits_per_token:.4f} | {t.ratio:.5f} | "
              f"{'yes' if t.within_guarantee else 'NO'} |" for t in bench.texts]
    lines += ["", "Mixer variants (ablations), model base:", "",
              "| variant | bits/token | quoting | others |", "|---|---:|---:|---:|"]
    lines += [f"| {v.name} | {v.bits_per_token:.3f} | {v.quoting_bits_per_token:.3f} | "
              f"{v.other_bits_per_token:.3f} |" for v in bench.variants]
    return "\n".join(lines) + "\n"

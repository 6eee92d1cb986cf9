"""One check run: code a session, measure everything ``checks.evaluate`` needs, build the report.

The checker reads; it never mutates the model, the data or a .skv file. The core package never
imports it.

What one run costs, and why (measured with its phases, ``CheckReport.phases``):

1. One prefill over the text, its output layer on blocks of rows (no ``[T, V]`` matrix: 1.6 GB
   of float32 at 8,192 tokens), shared by: the caller's KV the file codes a residual against
   (as ``seqkv compress`` does; the logits do not change the KV), the reference cross-entropy
   bound, Lemma 1's float reference, and the entropy-rate contexts (slices of its KV, their
   next-token rows, the only rows kept). Plus one row after the start token alone (the first
   token's distribution, as the coders have it).
2. ``compress`` at the level (its Theorem 1 gap comes with its trace: no forward per position),
   then a full decode, which verifies the file's digests (the float path's Lemma 1 gate).
3. Lemma 1 on the schedules that occur (``seqkv.checker.lemma1``): the integer predictor's KV
   planes, the float model's KV.
4. The model's entropy rate: ``entropy_contexts`` contexts drawn from the data, 2 sampled
   continuations of 32 tokens each, the contexts advanced together in batched forwards over the
   shared prefill's KV (``seqkv.checker.sampling``).
5. The per-vector figure: the entropy of 3-bit TurboQuant codes of the file's KV.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from seqkv.bench.figures import CommittedCodeBits, committed_code_bits
from seqkv.bounds import Bound, block_surprisal, code_within_table_cost, logit_blocks
from seqkv.checker.checks import Check, CheckInputs, CodeLengths, context_trend, evaluate
from seqkv.checker.estimators import Interval, percentile_interval
from seqkv.checker.lemma1 import REBUILT_SCHEDULES, Lemma1, float_schedules, integer_schedules
from seqkv.checker.per_vector import per_vector_entropy
from seqkv.checker.sampling import (
    EntropyRateEstimate,
    context_ends,
    estimate_entropy_rate_from_data,
)
from seqkv.codec import DEFAULT_TOLERANCE, CodingTrace, DecompressResult, Theorem1
from seqkv.errors import DecodeVerificationError, InsufficientSamplesError
from seqkv.levels import DEFAULT_LEVEL, parse_level
from seqkv.models.adapter import CausalLM
from seqkv.models.collisions import CollisionClasses, collision_classes
from seqkv.progress import ProgressSink
from seqkv.proofs.claims import Claim, Measurements, paper_claims
from seqkv.proofs.ratios import per_vector_bits_per_token, per_vector_over_sequential
from seqkv.schedule import pinned_threads, schedule_threads
from seqkv.skv import compress, decompress
from seqkv.types import ExecutionProfile, KVGeometry, ModelIdentity


@dataclass(frozen=True)
class CheckOptions:
    """How much to measure; see the module docstring for what the defaults buy."""

    entropy_contexts: int = 16  # contexts drawn from the data for the model's entropy rate
    # NOTE: sampled continuations per context. Each step of a batch reads every row's whole
    # context KV, so the estimate's cost is contexts x continuations x length x mean context:
    # with 4 continuations a check runs over its budget of a verified compress + 8 prefills
    # (benchmarks/check_cost.py). The interval is over the contexts' means (``sampling``
    # invariant 2), so 2 continuations keep it honest; they widen it.
    entropy_sequences: int = 2
    entropy_length: int = 32  # tokens per continuation
    lemma1_window: int = 32  # positions the token-by-token schedules are compared on
    per_vector_bits: int = 3  # the per-vector quantizer the paper compares against
    seed: int = 0


@dataclass(frozen=True)
class DataFingerprint:
    source: str
    kind: Literal["text", "skv"]
    sha256: str
    tokens: int  # positions the token code covers


@dataclass(frozen=True)
class RatioSummary:
    """The paper's ratio formula with this model's geometry, symbolic and Monte-Carlo."""

    geometry: KVGeometry
    per_vector_bits: int
    per_vector_bits_per_token: float
    fp16_bits_per_token: int
    measured_bits_per_token: float
    symbolic_ratio: float
    ratio_vs_fp16: float
    monte_carlo_ratio: Interval


@dataclass(frozen=True)
class Phase:
    """One phase of a check: CPU seconds of this process (all its threads) and wall seconds."""

    name: str
    cpu_seconds: float
    wall_seconds: float


@dataclass
class _Clock:
    phases: list[Phase] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        cpu, wall = time.process_time(), time.perf_counter()
        yield
        self.phases.append(Phase(name, time.process_time() - cpu, time.perf_counter() - wall))


@dataclass(frozen=True)
class CheckReport:
    model: ModelIdentity
    profile: ExecutionProfile
    data: DataFingerprint
    options: CheckOptions
    level: str
    lengths: CodeLengths
    cross_entropy_bits: float
    ideal_code_bits: float
    checks: tuple[Check, ...]
    theorem1: Theorem1 | None
    lemma1: Lemma1
    collisions: CollisionClasses
    ratios: RatioSummary
    paper_claims: tuple[Claim, ...]
    phases: tuple[Phase, ...]

    @property
    def passed(self) -> bool:
        """True when every bound holds (premises, claims and figures are reported, not
        gated)."""
        return all(check.holds for check in self.checks if check.kind == "bound")

    def to_json_dict(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "model": asdict(self.model),
            "data": asdict(self.data),
            "level": self.level,
            "tokens": self.lengths.tokens,
            "code_bits": self.lengths.code_bits,
            "residual_bits": self.lengths.residual_bits,
            "residual_escapes": self.lengths.residual_escapes,
            "cross_entropy_bits": self.cross_entropy_bits,
            "checks": [
                {"name": c.name, "kind": c.kind, "bound": c.bound,
                 "bound_expression": c.bound_expression, "measured": c.measured,
                 "interval": None if c.interval is None else asdict(c.interval),
                 "holds": c.holds, "method": c.method}
                for c in self.checks
            ],
            "theorem1": None if self.theorem1 is None else {
                **asdict(self.theorem1), "mean_gap_bits": self.theorem1.mean_gap_bits,
                "exact": True, "collision_classes": [list(c) for c in self.collisions.classes]},
            "lemma1": asdict(self.lemma1),
            "ratios": {
                "symbolic_ratio_vs_per_vector": self.ratios.symbolic_ratio,
                "monte_carlo_ratio_median": self.ratios.monte_carlo_ratio.estimate,
                "monte_carlo_ratio_range": [self.ratios.monte_carlo_ratio.low,
                                            self.ratios.monte_carlo_ratio.high],
                "ratio_vs_fp16": self.ratios.ratio_vs_fp16,
            },
            "paper_claims": [{"name": c.name, "holds": c.holds} for c in self.paper_claims],
            "phases": [asdict(p) for p in self.phases],
        }


@dataclass(frozen=True)
class _Shared:
    """The one prefill a check shares: over the text (the caller's KV, the reference code
    lengths, the next-token rows the entropy-rate contexts start from), plus the start token's
    row (the first token's distribution, as the coders have it). No ``[T, V]`` matrix is kept:
    the output layer runs on blocks of rows (``seqkv.bounds.logit_blocks``)."""

    # [T] -log2 p(t_i | t_<i), as seqkv.bounds computes it; None where the check needs none
    reference: npt.NDArray[np.float64] | None
    rows: dict[int, torch.Tensor]  # position -> [V] float32 logits after the first i + 1 tokens
    kv: torch.Tensor  # [L, 2, H, T, D]


@torch.inference_mode()
def _shared_prefill(model: CausalLM, tokens: list[int], keep: Sequence[int],
                    with_reference: bool) -> _Shared:
    """One prefill over the text (the ``prefill`` schedule's KV, bit for bit: the logits do not
    change it), its logit rows ``keep`` and, ``with_reference``, its reference code lengths
    (the start token's row gives the first)."""
    cache = DynamicCache()
    start = model.start_token_id
    reference = np.empty(len(tokens))
    rows: dict[int, torch.Tensor] = {}
    wanted = set(keep)
    ids = torch.tensor(tokens)
    with pinned_threads(schedule_threads("prefill")):
        for offset, block in logit_blocks(model.model, tokens, slice(0, len(tokens)), cache):
            for row in sorted(wanted.intersection(range(offset, offset + len(block)))):
                rows[row] = block[row - offset].float().cpu().clone()
            # row i codes token i + 1: the last row codes nothing
            coded = min(len(block), len(tokens) - 1 - offset) if with_reference else 0
            reference[offset + 1 : offset + 1 + coded] = block_surprisal(
                block[:coded], ids[offset + 1 : offset + 1 + coded])
        if with_reference and start is None:
            reference[0] = np.log2(model.vocab_size)
        elif with_reference:
            row = model.model(input_ids=torch.tensor([[start]], device=model.device)
                              ).logits[0, 0].double().cpu()
            reference[0] = -float(torch.log_softmax(row, dim=-1)[tokens[0]]) / np.log(2)
    return _Shared(reference if with_reference else None, rows, model.kv_tensor(cache))


def _keep(tokens: list[int], options: CheckOptions) -> list[int]:
    """The logit rows the entropy-rate contexts start from (``context_ends``), when the text
    has enough positions to draw them."""
    try:
        ends = context_ends(len(tokens), options.entropy_contexts, options.seed)
    except InsufficientSamplesError:
        return []
    return [end - 1 for end in ends]


def _decoded(model: CausalLM, data: bytes, progress: ProgressSink | None
             ) -> DecompressResult | None:
    """The file decoded and verified, or None where its KV digest was not restored."""
    try:
        return decompress(model, data, progress=progress)
    except DecodeVerificationError:
        return None


def check_text_tokens(
    model: CausalLM, tokens: list[int], source: str, tolerance: float = DEFAULT_TOLERANCE,
    options: CheckOptions | None = None, progress: ProgressSink | None = None,
    baselines: Path | None = None, level: str = DEFAULT_LEVEL,
) -> CheckReport:
    """Compress ``tokens`` at ``level`` with their prefill KV, decode the file, then check every
    bound on the result. The encoder's own bounds are reported, not raised, so a violation
    shows in the report."""
    options = options or CheckOptions()
    clock = _Clock()
    with clock.phase("shared prefill"):
        # the segments levels restart their context per segment: their reference is their own
        single = not parse_level(level).spec.name.startswith("segments")
        shared = _shared_prefill(model, tokens, _keep(tokens, options), with_reference=single)
    with clock.phase("compress"):
        result = compress(model, tokens, kv=shared.kv, tolerance=tolerance,
                          progress=progress, level=level, on_violation="return",
                          reference=shared.reference)
    with clock.phase("decode and verify"):
        decoded = _decoded(model, result.data, progress)
    stats = result.stats
    lengths = CodeLengths(stats.tokens, stats.code_bits, stats.residual_bits,
                          stats.residual_escapes)
    data = DataFingerprint(source, "text", _tokens_sha256(tokens), len(tokens))
    return _report(model, _Coded(tokens, result.trace, lengths, result.bounds,
                                 result.session.level, decoded is not None, shared,
                                 encoder_digest=result.stats.predictor_digest,
                                 decoder_digest=None if decoded is None
                                 else decoded.stats.predictor_digest,
                                 rebuilt=_rebuilt(level, result.kv)), data,
                   options, baselines, clock)


def check_skv(
    model: CausalLM, skv: bytes, source: str, options: CheckOptions | None = None,
    progress: ProgressSink | None = None, baselines: Path | None = None,
    max_tokens: int | None = None, max_memory_bytes: int | None = None,
) -> CheckReport:
    """Decode a .skv file (within ``max_tokens`` and ``max_memory_bytes``, as
    ``seqkv.decompress``), then check every bound on what it codes (per coded token)."""
    options = options or CheckOptions()
    clock = _Clock()
    with clock.phase("decode and verify"):
        decoded = decompress(model, skv, progress=progress, max_tokens=max_tokens,
                             max_memory_bytes=max_memory_bytes)
    session = decoded.session
    with clock.phase("shared prefill"):
        shared = _shared_prefill(model, decoded.tokens, _keep(decoded.tokens, options),
                                 with_reference=False)
    residual = session.residual
    lengths = CodeLengths(session.count, session.token_code.num_bits,
                          0 if residual is None else residual.num_bits,
                          0 if residual is None else residual.num_escapes)
    bounds = (code_within_table_cost(lengths.code_bits,
                                     float(decoded.trace.code_cost_bits.sum())),)
    data = DataFingerprint(source, "skv", hashlib.sha256(skv).hexdigest(), session.count)
    return _report(model, _Coded(decoded.tokens, decoded.trace, lengths, bounds, session.level,
                                 True, shared, session.count != len(decoded.tokens)), data,
                   options, baselines, clock)


@dataclass(frozen=True)
class _Coded:
    """What the checks need of one coded session, however it was obtained."""

    tokens: list[int]  # every token, the shared prefix included
    trace: CodingTrace
    lengths: CodeLengths
    run_bounds: tuple[Bound, ...]
    level: str
    digest_restored: bool  # a decode reproduced the file's tokens and KV digests
    shared: _Shared
    has_prefix: bool = False
    # the integer predictor's KV digests after the encode and the decode (portable levels;
    # None where a side did not run here or ran no integer predictor)
    encoder_digest: str | None = None
    decoder_digest: str | None = None
    # The level's decode schedule (``lemma1.REBUILT_SCHEDULES``) and the KV its encoder
    # computed on it for the whole text (what the decoder rebuilds), where it has one
    rebuilt: tuple[str, torch.Tensor] | None = None


def _rebuilt(level: str, kv: torch.Tensor | None) -> tuple[str, torch.Tensor] | None:
    """The encoder's KV named by the float schedule it was computed on, where Lemma 1 has one
    (``lemma1.REBUILT_SCHEDULES``)."""
    name = REBUILT_SCHEDULES.get(parse_level(level).spec.schedule)
    return None if name is None or kv is None else (name, kv)


def _tokens_sha256(tokens: list[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def _report(model: CausalLM, coded: _Coded, data: DataFingerprint, options: CheckOptions,
            baselines: Path | None, clock: _Clock) -> CheckReport:
    tokens = coded.tokens
    with clock.phase("Lemma 1: integer predictor"):
        integer = integer_schedules(model, tokens, coded.encoder_digest, coded.decoder_digest,
                                    options.lemma1_window)
    with clock.phase("Lemma 1: float model"):
        floats = float_schedules(model, tokens, coded.shared.kv, options.lemma1_window,
                                 rebuilt=coded.rebuilt)
    lemma1 = Lemma1(integer, floats, coded.lengths.residual_bits / coded.lengths.tokens,
                    coded.digest_restored)
    with clock.phase("entropy rate"):
        entropy_rate = estimate_entropy_rate_from_data(
            model, coded.shared.kv, coded.shared.rows, options.entropy_contexts,
            options.entropy_sequences, options.entropy_length, options.seed)
    with clock.phase("per-vector figure"):
        per_vector = per_vector_entropy(coded.shared.kv, options.per_vector_bits,
                                        options.seed)
    baseline = (committed_code_bits(model, tokens, coded.level, baselines)
                if not coded.has_prefix else
                CommittedCodeBits("no baseline row for these tokens", None, None, ""))
    classes = collision_classes(model)
    theorem1 = coded.trace.theorem1()
    inputs = CheckInputs(
        geometry=model.geometry, vocab_size=model.vocab_size, lengths=coded.lengths,
        trace=coded.trace, run_bounds=coded.run_bounds, baseline=baseline, theorem1=theorem1,
        lemma1=lemma1, collisions=classes, per_vector=per_vector, entropy_rate=entropy_rate)
    checks = evaluate(inputs)
    by_name = {c.name: c for c in checks}
    measured = Measurements(
        deterministic_per_schedule=lemma1.integer_holds and all(
            p.identical for p in floats if p.b == "the same prefill again"),
        schedule_invariant=by_name["schedule_invariant"].holds,
        kv_entropy_within_token_entropy=theorem1 is None or theorem1.gap_bits >= 0,
        kv_entropy_equals_token_entropy=theorem1 is not None and theorem1.max_gap_bits == 0,
        entropy_falls_with_context=context_trend(inputs).decreasing(),
    )
    return CheckReport(
        model=model.identity, profile=model.profile(), data=data, options=options,
        level=coded.level, lengths=coded.lengths,
        cross_entropy_bits=float(coded.trace.surprisal_bits.sum()),
        ideal_code_bits=float(coded.trace.code_cost_bits.sum()), checks=checks,
        theorem1=theorem1, lemma1=lemma1, collisions=classes,
        ratios=ratio_summary(model.geometry, options.per_vector_bits, coded.lengths,
                             entropy_rate),
        paper_claims=paper_claims(measured), phases=tuple(clock.phases))


def ratio_summary(
    geometry: KVGeometry, bits: int, lengths: CodeLengths, entropy_rate: EntropyRateEstimate
) -> RatioSummary:
    per_vector = float(per_vector_bits_per_token(geometry, bits))
    measured = lengths.bits_per_token
    symbolic = per_vector_over_sequential(geometry, bits, round(measured, 6)).ratio_float
    samples = per_vector / entropy_rate.per_sequence_surprisal
    fp16 = 16 * 2 * geometry.layers * geometry.kv_heads * geometry.head_dim
    return RatioSummary(
        geometry=geometry,
        per_vector_bits=bits,
        per_vector_bits_per_token=per_vector,
        fp16_bits_per_token=fp16,
        measured_bits_per_token=measured,
        symbolic_ratio=symbolic,
        ratio_vs_fp16=fp16 / measured,
        monte_carlo_ratio=percentile_interval(samples),
    )

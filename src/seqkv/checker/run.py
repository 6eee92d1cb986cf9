"""One check run: code a session, measure everything ``checks.evaluate`` needs, build the report.

The checker reads; it never mutates the model, the data or a .skv file. The core package never
imports it.

Monte-Carlo sizes (``CheckOptions``): Theorem 1 is measured at 32 prefixes drawn from the data;
the model's entropy rate from 16 contexts drawn from the data, 4 sampled continuations of 32
tokens each (64 sequences; the interval is a t-interval over the 16 contexts); the ratio's
Monte-Carlo range over the same 64 sequences.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from seqkv.bench.figures import CommittedCodeBits, committed_code_bits
from seqkv.bounds import (
    Bound,
    code_within_table_cost,
    reference_surprisal,
)
from seqkv.checker.checks import Check, CheckInputs, CodeLengths, context_trend, evaluate
from seqkv.checker.estimators import Interval, percentile_interval
from seqkv.checker.kv_entropy import KVEntropyEstimate, estimate_kv_entropy
from seqkv.checker.per_vector import per_vector_entropy
from seqkv.checker.premises import measure_determinism, measure_injectivity
from seqkv.checker.sampling import EntropyRateEstimate, estimate_entropy_rate_from_data
from seqkv.codec import DEFAULT_TOLERANCE, CodingTrace, compress, decompress
from seqkv.levels import DEFAULT_LEVEL
from seqkv.models.adapter import CausalLM
from seqkv.progress import ProgressSink
from seqkv.proofs.claims import Claim, Measurements, paper_claims
from seqkv.proofs.ratios import per_vector_bits_per_token, per_vector_over_sequential
from seqkv.types import ExecutionProfile, KVGeometry, ModelIdentity


@dataclass(frozen=True)
class CheckOptions:
    """How much to measure; see the module docstring for what the defaults buy."""

    determinism_tokens: int = 48  # the schedules are compared on the first 48 tokens
    kv_positions: int = 32  # prefixes drawn from the data for H(KV | prefix) vs H(t | prefix)
    kv_top_k: int = 32  # most probable next tokens stepped at each of them
    entropy_contexts: int = 16  # contexts drawn from the data for the model's entropy rate
    entropy_sequences: int = 4  # sampled continuations per context
    entropy_length: int = 32  # tokens per continuation
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
class CheckReport:
    model: ModelIdentity
    profile: ExecutionProfile
    data: DataFingerprint
    options: CheckOptions
    lengths: CodeLengths
    cross_entropy_bits: float
    ideal_code_bits: float
    checks: tuple[Check, ...]
    kv_entropy: KVEntropyEstimate
    ratios: RatioSummary
    paper_claims: tuple[Claim, ...]

    @property
    def passed(self) -> bool:
        """True when every bound holds (premises and claims are reported, not gated)."""
        return all(check.holds for check in self.checks if check.kind == "bound")

    def to_json_dict(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "model": asdict(self.model),
            "data": asdict(self.data),
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
            "kv_entropy_positions": [
                {"position": p.position, "token_entropy": p.token_entropy,
                 "kv_entropy": p.kv_entropy, "gap": p.gap, "tested_mass": p.tested_mass,
                 "merged": [list(g) for g in p.merged],
                 "nondeterministic": list(p.nondeterministic)}
                for p in self.kv_entropy.positions
            ],
            "ratios": {
                "symbolic_ratio_vs_per_vector": self.ratios.symbolic_ratio,
                "monte_carlo_ratio_median": self.ratios.monte_carlo_ratio.estimate,
                "monte_carlo_ratio_range": [self.ratios.monte_carlo_ratio.low,
                                            self.ratios.monte_carlo_ratio.high],
                "ratio_vs_fp16": self.ratios.ratio_vs_fp16,
            },
            "paper_claims": [{"name": c.name, "holds": c.holds} for c in self.paper_claims],
        }


@dataclass(frozen=True)
class _Coded:
    """What the checks need of one coded session, however it was obtained."""

    tokens: list[int]  # every token, the shared prefix included
    segments: list[list[int]]  # the coded tokens, as the level split them
    prefix: list[int]
    kv: torch.Tensor  # [layers, 2, kv_heads, tokens, head_dim]
    trace: CodingTrace
    lengths: CodeLengths
    run_bounds: tuple[Bound, ...]
    level: str


def check_text_tokens(
    model: CausalLM, tokens: list[int], source: str, tolerance: float = DEFAULT_TOLERANCE,
    options: CheckOptions | None = None, progress: ProgressSink | None = None,
    baselines: Path | None = None, level: str = DEFAULT_LEVEL,
) -> CheckReport:
    """Compress ``tokens`` with their prefill KV, then check every bound on the result.

    The encoder's own bounds are reported, not raised, so a violation shows in the report.
    """
    kv = model.prefill(tokens)
    result = compress(model, tokens, kv=kv, tolerance=tolerance, progress=progress,
                      level=level, on_violation="return")
    stats = result.stats
    coded = _Coded(tokens, [tokens], [], model.kv_tensor(kv), result.trace,
                   CodeLengths(stats.tokens, stats.code_bits, stats.residual_bits,
                               stats.residual_escapes),
                   result.bounds, result.session.level)
    data = DataFingerprint(source, "text", _tokens_sha256(tokens), len(tokens))
    return _report(model, coded, data, options or CheckOptions(), baselines)


def check_skv(
    model: CausalLM, skv: bytes, source: str, options: CheckOptions | None = None,
    progress: ProgressSink | None = None, baselines: Path | None = None,
) -> CheckReport:
    """Decode a .skv file, then check every bound on what it codes (per coded token)."""
    decoded = decompress(model, skv, progress=progress)
    session = decoded.session
    count = session.count
    prefix = decoded.tokens[: len(decoded.tokens) - count]
    tail = decoded.tokens[len(prefix):]
    lengths_list = list(session.segments)
    offsets = np.concatenate([[0], np.cumsum(lengths_list)]).astype(int)
    segments = [tail[offsets[j] : offsets[j + 1]] for j in range(len(lengths_list))]
    residual = session.residual
    lengths = CodeLengths(count, session.token_code.num_bits,
                          0 if residual is None else residual.num_bits,
                          0 if residual is None else residual.num_escapes)
    bounds = (code_within_table_cost(lengths.code_bits, float(decoded.trace.code_cost_bits.sum())),)
    coded = _Coded(decoded.tokens, segments, prefix, decoded.kv, decoded.trace, lengths, bounds,
                   session.level)
    data = DataFingerprint(source, "skv", hashlib.sha256(skv).hexdigest(), count)
    return _report(model, coded, data, options or CheckOptions(), baselines)


def _tokens_sha256(tokens: list[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def _report(model: CausalLM, coded: _Coded, data: DataFingerprint, options: CheckOptions,
            baselines: Path | None) -> CheckReport:
    tokens = coded.tokens
    entropy_rate = estimate_entropy_rate_from_data(
        model, tokens, options.entropy_contexts, options.entropy_sequences,
        options.entropy_length, options.seed)
    reference = reference_surprisal(model, coded.segments, model.start_token_id, coded.prefix,
                                    dtype=torch.float64)
    baseline = (committed_code_bits(model, coded.tokens, coded.level, baselines)
                if not coded.prefix else
                CommittedCodeBits("no baseline row for these tokens", None, None, ""))
    kv_entropy = estimate_kv_entropy(model, tokens, options.kv_positions, options.kv_top_k,
                                     options.seed)
    inputs = CheckInputs(
        geometry=model.geometry,
        vocab_size=model.vocab_size,
        lengths=coded.lengths,
        trace=coded.trace,
        run_bounds=coded.run_bounds,
        reference_float64_bits=float(reference.sum()),
        baseline=baseline,
        kv_entropy=kv_entropy,
        per_vector=per_vector_entropy(coded.kv, options.per_vector_bits, options.seed),
        determinism=measure_determinism(model, tokens[: options.determinism_tokens]),
        injectivity=measure_injectivity(model),
        entropy_rate=entropy_rate,
    )
    checks = evaluate(inputs)
    by_name = {c.name: c for c in checks}
    measured = Measurements(
        deterministic_per_schedule=by_name["deterministic_per_schedule"].holds,
        schedule_invariant=by_name["schedule_invariant"].holds,
        kv_entropy_within_token_entropy=by_name["kv_entropy_within_token_entropy"].holds,
        kv_entropy_equals_token_entropy=all(not p.merged and not p.nondeterministic
                                            for p in kv_entropy.positions),
        entropy_falls_with_context=context_trend(inputs).decreasing(),
    )
    return CheckReport(
        model=model.identity,
        profile=model.profile(),
        data=data,
        options=options,
        lengths=coded.lengths,
        cross_entropy_bits=float(coded.trace.surprisal_bits.sum()),
        ideal_code_bits=float(coded.trace.code_cost_bits.sum()),
        checks=checks,
        kv_entropy=kv_entropy,
        ratios=ratio_summary(model.geometry, options.per_vector_bits, coded.lengths,
                             entropy_rate),
        paper_claims=paper_claims(measured),
    )


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

"""One check run: code a session, measure everything ``checks.evaluate`` needs, build the report.

The checker reads; it never mutates the model, the data or a .skv file. The core package never
imports it.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch

from seqkv.checker.checks import Check, CheckInputs, CodeLengths, evaluate
from seqkv.checker.estimators import Interval, percentile_interval
from seqkv.checker.per_vector import per_vector_entropy
from seqkv.checker.premises import measure_determinism, measure_injectivity
from seqkv.checker.sampling import EntropyRateEstimate, ModelSource, estimate_entropy_rate
from seqkv.codec import DEFAULT_TOLERANCE, CodingTrace, compress, decompress
from seqkv.container import decode_container
from seqkv.models.adapter import CausalLM, ModelIdentity
from seqkv.proofs.claims import Claim, paper_claims
from seqkv.proofs.ratios import KVGeometry, per_vector_bits_per_token, per_vector_over_sequential
from seqkv.schedule import ExecutionProfile


@dataclass(frozen=True)
class CheckOptions:
    """How much to measure. Defaults keep a run on SmolLM2-135M near a minute on 2 cores."""

    determinism_tokens: int = 48  # the schedules are compared on the first 48 tokens
    entropy_sequences: int = 8  # sampled sequences for the model's entropy rate
    entropy_length: int = 48  # tokens per sampled sequence
    per_vector_bits: int = 3  # the per-vector quantizer the paper compares against
    seed: int = 0


@dataclass(frozen=True)
class DataFingerprint:
    source: str
    kind: Literal["text", "skv"]
    sha256: str
    tokens: int


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
            "cross_entropy_bits": self.cross_entropy_bits,
            "checks": [
                {"name": c.name, "kind": c.kind, "bound": c.bound,
                 "bound_expression": c.bound_expression, "measured": c.measured,
                 "holds": c.holds, "method": c.method}
                for c in self.checks
            ],
            "ratios": {
                "symbolic_ratio_vs_per_vector": self.ratios.symbolic_ratio,
                "monte_carlo_ratio_median": self.ratios.monte_carlo_ratio.estimate,
                "monte_carlo_ratio_range": [self.ratios.monte_carlo_ratio.low,
                                            self.ratios.monte_carlo_ratio.high],
                "ratio_vs_fp16": self.ratios.ratio_vs_fp16,
            },
        }


def check_text_tokens(
    model: CausalLM, tokens: list[int], source: str, tolerance: float = DEFAULT_TOLERANCE,
    options: CheckOptions | None = None, progress: bool = False,
) -> CheckReport:
    """Compress ``tokens`` with their prefill KV, then check every bound on the result."""
    kv = model.prefill(tokens)
    result = compress(model, tokens, kv=kv, tolerance=tolerance, progress=progress)
    lengths = CodeLengths(result.stats.tokens, result.stats.code_bits,
                          result.stats.residual_bits, _groups(result.header.kv.shape))
    data = DataFingerprint(source, "text", _tokens_sha256(tokens), len(tokens))
    return _report(model, tokens, model.kv_tensor(kv), result.trace, lengths, data,
                   options or CheckOptions())


def check_skv(
    model: CausalLM, skv: bytes, source: str, options: CheckOptions | None = None,
    progress: bool = False,
) -> CheckReport:
    """Decode a .skv file, then check every bound on its recorded sizes."""
    container = decode_container(skv)
    decoded = decompress(model, skv, progress=progress)
    residual_bits = 0 if container.residual is None else container.residual.num_bits
    lengths = CodeLengths(len(decoded.tokens), container.token_code.num_bits, residual_bits,
                          _groups(container.header.kv.shape))
    data = DataFingerprint(source, "skv", hashlib.sha256(skv).hexdigest(), len(decoded.tokens))
    return _report(model, decoded.tokens, decoded.kv, decoded.trace, lengths, data,
                   options or CheckOptions())


def _groups(shape: list[int]) -> int:
    return shape[0] * shape[1]


def _tokens_sha256(tokens: list[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def _report(
    model: CausalLM, tokens: list[int], kv: torch.Tensor, trace: CodingTrace,
    lengths: CodeLengths, data: DataFingerprint, options: CheckOptions,
) -> CheckReport:
    entropy_rate = estimate_entropy_rate(ModelSource(model), options.entropy_sequences,
                                         options.entropy_length, options.seed)
    inputs = CheckInputs(
        geometry=model.geometry,
        vocab_size=model.vocab_size,
        lengths=lengths,
        trace=trace,
        per_vector=per_vector_entropy(kv, options.per_vector_bits, options.seed),
        determinism=measure_determinism(model, tokens[: options.determinism_tokens]),
        injectivity=measure_injectivity(model),
        entropy_rate=entropy_rate,
    )
    return CheckReport(
        model=model.identity,
        profile=model.profile(),
        data=data,
        options=options,
        lengths=lengths,
        cross_entropy_bits=float(trace.surprisal_bits.sum()),
        ideal_code_bits=float(trace.code_cost_bits.sum()),
        checks=evaluate(inputs),
        ratios=_ratios(model.geometry, options.per_vector_bits, lengths, entropy_rate),
        paper_claims=paper_claims(),
    )


def _ratios(
    geometry: KVGeometry, bits: int, lengths: CodeLengths, entropy_rate: EntropyRateEstimate
) -> RatioSummary:
    per_vector = float(per_vector_bits_per_token(geometry, bits))
    measured = lengths.total_bits_per_token
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

"""The CI gate: bounds hold for the real coder, fail for a wasteful one; the report is golden."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

import seqkv.codec
from seqkv.checker import CheckOptions, CodeLengths, check_text_tokens, render_markdown
from seqkv.checker.checks import CheckInputs, evaluate
from seqkv.checker.estimators import Interval
from seqkv.checker.per_vector import PerVectorEntropy
from seqkv.checker.premises import DeterminismMeasurement, InjectivityMeasurement
from seqkv.checker.run import CheckReport, DataFingerprint, _ratios
from seqkv.checker.sampling import EntropyRateEstimate
from seqkv.codec import CodingTrace
from seqkv.coding.frequencies import cumulative_from_logits, log_softmax_bits
from seqkv.models import CausalLM, ModelIdentity
from seqkv.proofs.claims import paper_claims
from seqkv.proofs.ratios import KVGeometry
from seqkv.schedule import ExecutionProfile

GOLDEN = Path(__file__).parent / "data" / "check_report_golden.md"
FAST = CheckOptions(determinism_tokens=16, entropy_sequences=4, entropy_length=16)
TOKENS = [int(t) for t in np.random.default_rng(5).integers(0, 512, 80)]


def _wasteful_table(
    logits: npt.NDArray[np.floating],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A deliberately wasteful coder: its tables are far sharper than the model's distribution
    (the log2-probabilities it reports, from which the bound is computed, stay the model's)."""
    return (cumulative_from_logits(np.asarray(logits, dtype=np.float64) * 50.0),
            log_softmax_bits(logits))


def test_the_real_coder_passes_every_bound(tiny_model: CausalLM) -> None:
    report = check_text_tokens(tiny_model, TOKENS, "random-tokens", options=FAST)
    assert report.passed
    assert {c.name for c in report.checks if c.kind == "bound"} == {
        "token_code_within_cross_entropy",
        "kv_code_within_token_entropy",
        "sequential_below_per_vector_entropy",
    }


def test_a_wasteful_coder_fails_the_gate(
    tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seqkv.codec, "table_and_log2p", _wasteful_table)
    report = check_text_tokens(tiny_model, TOKENS, "random-tokens", options=FAST)
    failed = {c.name for c in report.checks if c.kind == "bound" and not c.holds}
    assert not report.passed
    assert failed == {"token_code_within_cross_entropy", "kv_code_within_token_entropy"}
    assert report.to_json_dict()["passed"] is False


def _synthetic_report() -> CheckReport:
    geometry = KVGeometry(2, 2, 16)
    positions = 64
    surprisal = 4.0 + np.cos(np.arange(positions, dtype=np.float64))
    trace = CodingTrace(surprisal, surprisal + 1e-6, surprisal - 0.5)
    lengths = CodeLengths(positions, 258, 4, 4)
    entropy = EntropyRateEstimate(
        entropy_rate=Interval(4.2, 3.9, 4.5, 0.95, "synthetic"),
        sampled_surprisal=Interval(4.1, 3.7, 4.5, 0.95, "synthetic"),
        per_sequence_entropy=np.array([4.0, 4.4]),
        per_sequence_surprisal=np.array([3.9, 4.3, 4.1]),
        sequences=3,
        length=16,
    )
    inputs = CheckInputs(
        geometry=geometry,
        vocab_size=512,
        lengths=lengths,
        trace=trace,
        per_vector=PerVectorEntropy(3, Interval(2.8, 2.7, 2.9, 0.95, "synthetic"),
                                    Interval(358.4, 345.6, 371.2, 0.95, "synthetic"), 128, 128),
        determinism=DeterminismMeasurement(16, 0.0, 6.5e-5, 6.5e-5, 6.1e-5),
        injectivity=InjectivityMeasurement(512, 64, ((3, 9),), 0.0, (3, 9)),
        entropy_rate=entropy,
    )
    return CheckReport(
        model=ModelIdentity("synthetic", "a" * 64, "b" * 64, None),
        profile=ExecutionProfile("token-by-token", "float32", "cpu", "AVX2", 1, "2.13.0",
                                 "5.24.0"),
        data=DataFingerprint("synthetic.txt", "text", "c" * 64, positions),
        options=CheckOptions(),
        lengths=lengths,
        cross_entropy_bits=float(surprisal.sum()),
        ideal_code_bits=float(trace.code_cost_bits.sum()),
        checks=evaluate(inputs),
        ratios=_ratios(geometry, 3, lengths, entropy),
        paper_claims=paper_claims(),
    )


def test_report_matches_the_golden_file() -> None:
    rendered = render_markdown(_synthetic_report())
    if os.environ.get("SEQKV_REGENERATE_GOLDEN"):
        GOLDEN.write_text(rendered)
    assert rendered == GOLDEN.read_text()


def test_golden_report_shows_failures_and_verdicts() -> None:
    text = GOLDEN.read_text()
    assert "**Verdict: PASS**" in text
    assert "| `first_layer_kv_injective` |" in text and "does not hold" in text

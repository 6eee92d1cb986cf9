"""The CI gate: bounds hold for the real coder and fail for wrong ones; Theorem 1 is measured and
can fail; the report is golden and shows failing rows."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import torch

import seqkv.levels.base
from seqkv.bench.figures import CommittedCodeBits
from seqkv.bounds import Bound
from seqkv.checker import CheckOptions, CodeLengths, check_text_tokens, render_markdown
from seqkv.checker.checks import CheckInputs, evaluate, kv_entropy_check
from seqkv.checker.estimators import Interval
from seqkv.checker.kv_entropy import (
    KVEntropyEstimate,
    PositionEntropy,
    estimate_kv_entropy,
)
from seqkv.checker.per_vector import PerVectorEntropy
from seqkv.checker.premises import DeterminismMeasurement, InjectivityMeasurement
from seqkv.checker.run import CheckReport, DataFingerprint, ratio_summary
from seqkv.checker.sampling import EntropyRateEstimate
from seqkv.codec import CodingTrace
from seqkv.coding.frequencies import cumulative_from_logits, log_softmax_bits
from seqkv.models import CausalLM, ModelIdentity, tiny_random_llama
from seqkv.proofs.claims import Measurements, paper_claims
from seqkv.types import ExecutionProfile, KVGeometry

GOLDEN = Path(__file__).parent / "data" / "check_report_golden.md"
FAST = CheckOptions(determinism_tokens=16, kv_positions=6, kv_top_k=8, entropy_contexts=3,
                    entropy_sequences=2, entropy_length=8)
TOKENS = [int(t) for t in np.random.default_rng(5).integers(0, 512, 80)]


def _sharpened(
    logits: npt.NDArray[np.floating],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A model 50x sharper than the real one, consistently in the table and the log2 p the
    coder reports: the coder's own accounting cannot see it."""
    sharp = np.asarray(logits, dtype=np.float64) * 50.0
    return cumulative_from_logits(sharp), log_softmax_bits(sharp)


def test_the_real_coder_passes_every_bound(tiny_model: CausalLM) -> None:
    report = check_text_tokens(tiny_model, TOKENS, "random-tokens", options=FAST)
    assert report.passed
    assert {c.name for c in report.checks if c.kind == "bound"} == {
        "code_within_table_cost",
        "code_within_reference_cross_entropy",
        "residual_within_tolerance",
        "file_bytes_accounted",
        "code_within_float64_cross_entropy",
        "kv_entropy_within_token_entropy",
    }
    assert {c.name for c in report.checks if c.kind == "figure"} == {
        "sequential_below_per_vector_entropy", "code_bits_equal_baseline"}
    kv_check = next(c for c in report.checks if c.name == "kv_entropy_within_token_entropy")
    assert kv_check.interval is not None
    assert report.to_json_dict()["kv_entropy_positions"]


def test_a_sharpened_model_fails_the_gate_its_own_accounting_passes(
    tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seqkv.levels.base, "model_distribution", _sharpened)
    report = check_text_tokens(tiny_model, TOKENS, "random-tokens", options=FAST, level="tokens")
    failed = {c.name for c in report.checks if c.kind == "bound" and not c.holds}
    assert failed == {"code_within_reference_cross_entropy", "code_within_float64_cross_entropy"}
    assert report.to_json_dict()["passed"] is False


def test_the_gate_does_not_depend_on_the_residual_tolerance(tiny_model: CausalLM) -> None:
    report = check_text_tokens(tiny_model, TOKENS[:40], "random-tokens", tolerance=0.0,
                               options=FAST)
    assert report.passed  # a bit-exact residual costs bits, but no bound counts them
    assert report.lengths.residual_bits > 0


def _noisy_model() -> CausalLM:
    """A model whose first layer adds fresh noise to its keys at every call: not a function of
    its tokens, as a forward with dropout left on would not be."""
    model = tiny_random_llama(seed=3)
    projection = model.model.model.layers[0].self_attn.k_proj
    projection.register_forward_hook(
        lambda module, inputs, output: output + 1e-3 * torch.randn_like(output))
    return model


def test_a_nondeterministic_forward_fails_lemma1_and_theorem1() -> None:
    estimate = estimate_kv_entropy(_noisy_model(), TOKENS[:24], positions=4, top_k=8)
    assert not estimate.deterministic
    assert all(p.gap < 0 for p in estimate.positions)  # H(KV) > H(t): KV is no function of t
    assert not kv_entropy_check(estimate).holds


def test_tied_embedding_rows_lower_kv_entropy_by_the_within_group_entropy() -> None:
    model = tiny_random_llama(seed=4)
    groups = [(10, 11), (20, 21, 22)]
    with torch.no_grad():
        embedding = model.model.model.embed_tokens.weight
        for group in groups:
            for token in group[1:]:
                embedding[token] = embedding[group[0]]
    estimate = estimate_kv_entropy(model, TOKENS[:30], positions=5, top_k=4)
    assert estimate.collision_groups == ((10, 11), (20, 21, 22))
    with torch.inference_mode():
        logits = model.model(input_ids=torch.tensor([TOKENS[:30]])).logits[0].double()
    log2p = (torch.log_softmax(logits, dim=-1) / np.log(2.0)).numpy()
    for row in estimate.positions:
        p = np.exp2(log2p[row.position - 1])
        within = 0.0
        for group in groups:
            mass = p[list(group)]
            within -= float((mass * np.log2(mass / mass.sum())).sum())  # P(g) H(t | g)
        assert row.token_entropy == pytest.approx(float(-(p * np.log2(p)).sum()), abs=1e-9)
        assert row.gap == pytest.approx(within, abs=1e-9)
        assert set(row.merged) == set(groups)
    assert kv_entropy_check(estimate).holds


def _synthetic_report() -> CheckReport:
    geometry = KVGeometry(2, 2, 16)
    positions = 64
    surprisal = 4.0 + np.cos(np.arange(positions, dtype=np.float64))
    trace = CodingTrace(surprisal, surprisal + 1e-6, surprisal - 0.5)
    lengths = CodeLengths(positions, 258, 4, 0)
    entropy = EntropyRateEstimate(
        entropy_rate=Interval(4.2, 3.9, 4.5, 0.95, "synthetic"),
        sampled_surprisal=Interval(4.1, 3.7, 4.5, 0.95, "synthetic"),
        per_sequence_entropy=np.array([4.0, 4.4]),
        per_sequence_surprisal=np.array([3.9, 4.3, 4.1]),
        sequences=3,
        length=16,
    )
    kv_entropy = KVEntropyEstimate(
        positions=(PositionEntropy(5, 4.5, 4.25, ((3, 9),), (), 0.9),
                   PositionEntropy(17, 3.0, 3.5, (), (7,), 0.8)),
        top_k=8, collision_groups=((3, 9),),
        token_entropy=Interval(3.75, 3.0, 4.5, 0.95, "synthetic"),
        kv_entropy=Interval(3.875, 3.25, 4.5, 0.95, "synthetic"),
        gap=Interval(-0.125, -0.5, 0.25, 0.95, "synthetic"),
    )
    run_bounds = (Bound("code_within_table_cost", "synthetic", 259.0, 258.0, True, "synthetic"),)
    inputs = CheckInputs(
        geometry=geometry,
        vocab_size=512,
        lengths=lengths,
        trace=trace,
        run_bounds=run_bounds,
        reference_float64_bits=float(surprisal.sum()),
        baseline=CommittedCodeBits("gated", 257, None, "integer.json"),
        kv_entropy=kv_entropy,
        per_vector=PerVectorEntropy(3, Interval(2.8, 2.7, 2.9, 0.95, "synthetic"),
                                    Interval(358.4, 345.6, 371.2, 0.95, "synthetic"), 128, 128),
        determinism=DeterminismMeasurement(16, 0.0, 6.5e-5, 6.5e-5, 6.1e-5),
        injectivity=InjectivityMeasurement(512, 64, ((3, 9),), 0.0, (3, 9)),
        entropy_rate=entropy,
    )
    checks = evaluate(inputs)
    return CheckReport(
        model=ModelIdentity("synthetic", "a" * 64, "b" * 64, None),
        profile=ExecutionProfile("token-by-token", "float32", "cpu", "AVX2", 1, "2.13.0",
                                 "5.24.0"),
        data=DataFingerprint("synthetic.txt", "text", "c" * 64, positions),
        options=CheckOptions(),
        lengths=lengths,
        cross_entropy_bits=float(surprisal.sum()),
        ideal_code_bits=float(trace.code_cost_bits.sum()),
        checks=checks,
        kv_entropy=kv_entropy,
        ratios=ratio_summary(geometry, 3, lengths, entropy),
        paper_claims=paper_claims(Measurements(True, False, False, False, False)),
    )


def test_report_matches_the_golden_file() -> None:
    rendered = render_markdown(_synthetic_report())
    if os.environ.get("SEQKV_REGENERATE_GOLDEN"):
        GOLDEN.write_text(rendered)
    assert rendered == GOLDEN.read_text()


def test_golden_report_shows_failing_bounds_and_measured_verdicts() -> None:
    text = GOLDEN.read_text()
    assert "**Verdict: FAIL**" in text
    for failing in ("code_bits_equal_baseline", "kv_entropy_within_token_entropy"):
        row = next(line for line in text.splitlines() if line.startswith(f"| `{failing}` |"))
        assert row.endswith("| **FAIL** |")
    theorem = next(line for line in text.splitlines() if line.startswith("| `theorem1` |"))
    assert "does not hold" in theorem

"""Render a ``CheckReport`` as a markdown proof-check report.

The rendering is a pure function of the report (golden-tested), so two runs with equal
measurements give byte-identical reports.
"""

from __future__ import annotations

from seqkv.checker.checks import Check
from seqkv.checker.run import CheckReport


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.4g}"
    return f"{value:,.4f}".rstrip("0").rstrip(".")


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell (a bare | would end the cell)."""
    return text.replace("|", "\\|")


def _verdict(holds: bool, kind: str) -> str:
    if kind == "figure":
        return "figure (not a check)"
    if kind == "bound":
        return "PASS" if holds else "**FAIL**"
    return "holds" if holds else "does not hold"


def _rows(checks: list[Check]) -> list[str]:
    lines = ["| check | bound (symbolic) | bound | measured | interval | verdict |",
             "|---|---|---|---|---|---|"]
    for c in checks:
        interval = "-" if c.interval is None else (
            f"[{_number(c.interval.low)}, {_number(c.interval.high)}] "
            f"({c.interval.confidence:.0%})")
        lines.append(f"| `{c.name}` | `{_cell(c.bound_expression)}` | {_number(c.bound)} | "
                     f"{_number(c.measured)} | {interval} | {_verdict(c.holds, c.kind)} |")
    lines.append("")
    for c in checks:
        lines.append(f"- `{c.name}`: {c.statement}. Method: {c.method}. Paper: {c.paper}.")
    return lines


def _kv_entropy_rows(report: CheckReport) -> list[str]:
    estimate = report.kv_entropy
    lines = [
        f"Positions drawn from the data: {len(estimate.positions)}; top {estimate.top_k} "
        f"candidates stepped twice each, plus every id with an identical first-layer [K | V] "
        f"({', '.join(str(list(g)) for g in estimate.collision_groups) or 'none'}).",
        "",
        "| | mean bits | interval |",
        "|---|---|---|",
    ]
    for name, interval in (("H(t_(i+1) \\| prefix)", estimate.token_entropy),
                           ("H(KV_(i+1) \\| prefix)", estimate.kv_entropy),
                           ("gap", estimate.gap)):
        lines.append(f"| {name} | {_number(interval.estimate)} | [{_number(interval.low)}, "
                     f"{_number(interval.high)}] ({interval.confidence:.0%}) |")
    lines += ["", "| position | H(t) | H(KV) | gap | tested mass | merged | nondeterministic |",
              "|---:|---:|---:|---:|---:|---|---|"]
    for p in estimate.positions:
        lines.append(f"| {p.position} | {_number(p.token_entropy)} | {_number(p.kv_entropy)} | "
                     f"{_number(p.gap)} | {p.tested_mass:.3f} | "
                     f"{_cell(str([list(g) for g in p.merged]) if p.merged else '-')} | "
                     f"{list(p.nondeterministic) if p.nondeterministic else '-'} |")
    return lines


def render_markdown(report: CheckReport) -> str:
    bounds = [c for c in report.checks if c.kind == "bound"]
    premises = [c for c in report.checks if c.kind == "premise"]
    claims = [c for c in report.checks if c.kind == "claim"]
    figures = [c for c in report.checks if c.kind == "figure"]
    r = report.ratios
    n = report.lengths.tokens
    lines = [
        "# seqkv proof-check report",
        "",
        f"**Verdict: {'PASS' if report.passed else 'FAIL'}**: "
        f"{sum(c.holds for c in bounds)} of {len(bounds)} bounds hold. Premises and claims "
        "are measured and reported; only bounds gate.",
        "",
        "## Run",
        "",
        f"- model: {report.model.name}; config sha256 `{report.model.config_sha256[:16]}`, "
        f"weights sha256 `{report.model.weights_sha256[:16]}`, tokenizer sha256 "
        f"`{(report.model.tokenizer_sha256 or 'none')[:16]}`",
        f"- data: `{report.data.source}` ({report.data.kind}), {report.data.tokens} tokens, "
        f"sha256 `{report.data.sha256[:16]}`",
        f"- schedule: {report.profile.schedule}, {report.profile.dtype}, "
        f"{report.profile.device_class} ({report.profile.cpu_capability}), "
        f"{report.profile.num_threads} thread; torch {report.profile.torch_version}, "
        f"transformers {report.profile.transformers_version}",
        f"- options: {report.options}",
        "",
        "## Coded size against the ideal",
        "",
        "| | bits | bits/token |",
        "|---|---|---|",
        f"| model cross-entropy, sum of -log2 p | {_number(report.cross_entropy_bits)} | "
        f"{_number(report.cross_entropy_bits / n)} |",
        f"| ideal under the coder's integer tables | {_number(report.ideal_code_bits)} | "
        f"{_number(report.ideal_code_bits / n)} |",
        f"| token code, measured | {report.lengths.code_bits:,} | "
        f"{_number(report.lengths.code_bits / n)} |",
        f"| KV residual code, measured ({report.lengths.residual_escapes:,} escapes; reported "
        f"apart: no bound depends on the tolerance) | {report.lengths.residual_bits:,} | "
        f"{_number(report.lengths.residual_bits / n)} |",
        "",
        "## Bounds (gate)",
        "",
        *_rows(bounds),
        "",
        "## Report figures (measured and shown; not checks: no verdict of theirs can fail)",
        "",
        *(_rows(figures) if figures else ["none on this run"]),
        "",
        "## Theorem 1 measured: H(KV_(i+1) | prefix) against H(t_(i+1) | prefix)",
        "",
        *_kv_entropy_rows(report),
        "",
        "## Theorem 1's premises, measured",
        "",
        *_rows(premises),
        "",
        "## The paper's claims against this run",
        "",
        *_rows(claims),
        "",
        "## Ratios: symbolic and Monte-Carlo",
        "",
        f"Formula (`seqkv.proofs.ratios`): ratio = 2 L H_kv d_head b / h, here L = "
        f"{r.geometry.layers}, H_kv = {r.geometry.kv_heads}, d_head = {r.geometry.head_dim}, "
        f"b = {r.per_vector_bits}: {_number(r.per_vector_bits_per_token)} bits/token per-vector.",
        "",
        "| ratio | value |",
        "|---|---|",
        f"| symbolic, h = measured {_number(r.measured_bits_per_token)} bits/token | "
        f"{_number(r.symbolic_ratio)}x |",
        f"| Monte-Carlo over sampled sequences, median [{r.monte_carlo_ratio.confidence:.0%} "
        f"range] | {_number(r.monte_carlo_ratio.estimate)}x [{_number(r.monte_carlo_ratio.low)}"
        f", {_number(r.monte_carlo_ratio.high)}] |",
        f"| vs fp16 KV ({r.fp16_bits_per_token:,} bits/token) | {_number(r.ratio_vs_fp16)}x |",
        "",
        "The Monte-Carlo ratios use sequences sampled from the model itself, so they reflect the "
        "model's own entropy rate rather than this text's cross-entropy.",
        "",
        "## The paper's stated numbers (`seqkv.proofs`)",
        "",
        "| claim | paper | derived | verdict | note |",
        "|---|---|---|---|---|",
    ]
    for claim in report.paper_claims:
        lines.append(
            f"| `{claim.name}` | {_number(claim.paper_value)} {claim.unit} | "
            f"{_number(claim.derived_value)} {claim.unit} | "
            f"{'holds' if claim.holds else 'does not hold'} | {_cell(claim.note)} |"
        )
    lines.append("")
    return "\n".join(lines)

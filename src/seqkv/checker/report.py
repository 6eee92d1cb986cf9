"""Render a ``CheckReport`` as a markdown proof-check report.

The rendering is a pure function of the report (golden-tested), so two runs with equal
measurements give byte-identical reports.
"""

from __future__ import annotations

from seqkv.checker.checks import Check
from seqkv.checker.run import CheckReport
from seqkv.provenance import RunHeader


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


def _theorem1_rows(report: CheckReport) -> list[str]:
    theorem1 = report.theorem1
    classes = report.collisions
    lines = [f"KV-collision classes of the model (first-layer [K | V] equality, confirmed by a "
             f"forward): {', '.join(str(list(c)) for c in classes.classes) or 'none'}.", ""]
    if theorem1 is None:
        return [*lines, "Not measured at this level: its tables are not the model's."]
    lines += [
        f"Exact at every one of the {theorem1.positions} coded positions, from the coder's "
        "own next-token distributions (no forward per position).",
        "",
        "| | sum, bits | mean, bits/position |",
        "|---|---|---|",
        f"| H(t_(i+1) \\| prefix) | {_number(theorem1.token_entropy_bits)} | "
        f"{_number(theorem1.token_entropy_bits / theorem1.positions)} |",
        f"| H(KV_(i+1) \\| prefix) | {_number(theorem1.kv_entropy_bits)} | "
        f"{_number(theorem1.kv_entropy_bits / theorem1.positions)} |",
        f"| gap | {_number(theorem1.gap_bits)} | {_number(theorem1.mean_gap_bits)} (max "
        f"{_number(theorem1.max_gap_bits)}) |",
        "",
        "Positions where the gap is largest: "
        + (", ".join(f"{p} ({_number(g)} bits)" for p, g in theorem1.top_positions) or "none")
        + ".",
    ]
    return lines


def _lemma1_rows(report: CheckReport) -> list[str]:
    lemma1 = report.lemma1
    lines = ["| path | schedule a | schedule b | positions | max difference | identical |",
             "|---|---|---|---:|---:|---|"]
    for pair in (*lemma1.integer, *lemma1.float_kv):
        lines.append(f"| {pair.path} | {pair.a} | {pair.b} | {pair.positions:,} | "
                     f"{_number(pair.max_abs_difference)} | "
                     f"{'yes' if pair.identical else 'no'} |")
    restored = "restored" if lemma1.digest_restored else "NOT restored"
    lines += ["", f"The float path's residual: {_number(lemma1.residual_bits_per_token)} bits "
              f"per token; the file's KV digest {restored} by a full decode on this machine."]
    return lines


def _phase_rows(report: CheckReport) -> list[str]:
    lines = ["| phase | CPU seconds | wall seconds |", "|---|---:|---:|"]
    for phase in report.phases:
        lines.append(f"| {phase.name} | {phase.cpu_seconds:.1f} | {phase.wall_seconds:.1f} |")
    total_cpu = sum(p.cpu_seconds for p in report.phases)
    total_wall = sum(p.wall_seconds for p in report.phases)
    lines.append(f"| total | {total_cpu:.1f} | {total_wall:.1f} |")
    return lines


def _run_lines(report: CheckReport, header: RunHeader | None) -> list[str]:
    """The ``## Run`` facts: the run header's command, commit and load first (a report's first
    lines carry its provenance), then the model, the data and the execution profile."""
    model = (f"- model: {report.model.name}; config sha256 `{report.model.config_sha256[:16]}`, "
             f"weights sha256 `{report.model.weights_sha256[:16]}`, tokenizer sha256 "
             f"`{(report.model.tokenizer_sha256 or 'none')[:16]}`")
    data = (f"- data: `{report.data.source}` ({report.data.kind}), {report.data.tokens} tokens, "
            f"sha256 `{report.data.sha256[:16]}`")
    profile = (f"{report.profile.device_class} ({report.profile.cpu_capability}, "
               f"{report.profile.cpu_model}), {report.profile.dtype}; torch "
               f"{report.profile.torch_version}, transformers "
               f"{report.profile.transformers_version}")
    if header is None:
        return [model, data, f"- machine: {profile}"]
    return [f"- command: `{header.command}`", f"- commit: {header.commit}",
            f"- load average (1, 5, 15 min): {header.load()}", model, data,
            f"- machine: {header.machine}; profile {profile}", f"- CPU path: {header.cpu_path}"]


def render_markdown(report: CheckReport, header: RunHeader | None = None) -> str:
    """The report as markdown; ``header`` (``seqkv.provenance.start_run``) adds the run's
    command, commit, load and CPU path to its ``## Run`` section."""
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
        *_run_lines(report, header),
        f"- level: {report.level}; options: {report.options}",
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
        "## Lemma 1 where it can fail: the KV on the schedules that occur (the gate)",
        "",
        *_lemma1_rows(report),
        "",
        "## Theorem 1, exact: H(KV_(i+1) | prefix) against H(t_(i+1) | prefix)",
        "",
        *_theorem1_rows(report),
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
        "## What this check cost, phase by phase",
        "",
        *_phase_rows(report),
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

"""Deterministic figures of every coding level, gated exactly against committed baselines.

Code lengths, file sizes, residual sizes and forward counts are deterministic: the same code on
the same execution profile gives the same numbers, to the bit. So CI compares them exactly
against a baseline committed in the repository, and any change (a better coder, a regression, a
format change) shows as a table of old / new / delta that a reviewer reads in the diff of the
baseline file. Timings are not here (see ``benchmarks/``): they are noisy, these are not.

Figures of the model-coded levels depend on the floating-point bits of the model's logits, so on
the CPU kind and library versions; every baseline file is therefore keyed by the execution
profile (``profile_key``), and a profile without a baseline is an error that names the one
command that records it (``seqkv bench figures --record``).

Invariants:
1. ``measure_figures`` decodes every file it codes and raises unless the tokens come back
   exactly (enforced; ``decompress`` also verifies both checksums).
2. ``compare_figures`` reports every field that differs, with no tolerance (enforced).
3. A baseline names the texts by the SHA-256 of their tokens, so a changed text or tokenizer is a
   changed figure too (enforced: ``tokens_sha256`` is a gated field).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from seqkv.codec import DEFAULT_TOLERANCE, compress, decompress
from seqkv.errors import DecodeVerificationError, SeqKVError
from seqkv.models.adapter import CausalLM
from seqkv.models.rows import row_forward

# NOTE: 96 tokens of each kind keep the whole gate (every level coded and decoded) near three
# minutes on a 2-core CPU, long enough for every level to reach its steady state (the rows
# level's drafts, four segments of 24 tokens).
GATE_TOKENS = 96
GATE_LEVELS = ("tokens", "rows", "segments:4", "ngram", "plain", "portable", "portable4")
TEXT_FILES = {"prose": "sample.txt", "code": "kinds/code.txt", "legal": "kinds/legal.txt",
              "technical": "kinds/technical.txt"}


@dataclass(frozen=True)
class GateCase:
    """One text (its first ``tokens`` tokens, or all of it) coded at one level."""

    kind: str
    tokens: int | None
    level: str

    @property
    def label(self) -> str:
        return self.kind if self.tokens is not None else f"{self.kind}-full"


# Every level on 96 tokens of every kind, and the whole prose sample at the default level: the
# text ``scripts/test.sh`` runs ``seqkv check`` on, whose code length the check gates too.
GATE_CASES = (*(GateCase(kind, GATE_TOKENS, level) for kind in TEXT_FILES
                for level in GATE_LEVELS), GateCase("prose", None, "tokens"))
BASELINE_DIR = Path("benchmarks") / "baselines" / "figures"
RECORD_COMMAND = "seqkv bench figures --record"


class MissingBaselineError(SeqKVError):
    """No committed baseline exists for this machine's execution profile."""


@dataclass(frozen=True)
class LevelFigures:
    """The deterministic figures of one text coded and decoded at one level."""

    text: str
    level: str
    tokens: int
    tokens_sha256: str
    code_bits: int
    residual_bits: int
    residual_escapes: int
    file_bytes: int
    encode_forwards: int
    decode_forwards: int

    @property
    def key(self) -> tuple[str, str]:
        return self.text, self.level


@dataclass(frozen=True)
class FigureChange:
    text: str
    level: str
    figure: str
    old: int | str | None
    new: int | str | None


def shipped_text(kind: str) -> str:
    """One of the texts shipped in ``seqkv/data`` (prose, code, legal, technical)."""
    return (importlib.resources.files("seqkv") / "data" / TEXT_FILES[kind]).read_text("utf-8")


def _sha256_tokens(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def measure_figures(model: CausalLM, cases: Sequence[GateCase] = GATE_CASES,
                    tolerance: float = DEFAULT_TOLERANCE) -> list[LevelFigures]:
    """Code every case's tokens with the KV of one prefill, decode each file, and return the
    figures."""
    figures = []
    for case in cases:
        tokens = model.encode_text(shipped_text(case.kind))
        tokens = tokens if case.tokens is None else tokens[: case.tokens]
        result = compress(model, tokens, kv=model.prefill(tokens), tolerance=tolerance,
                          level=case.level)
        decoded = decompress(model, result.data)
        if decoded.tokens != tokens:
            raise DecodeVerificationError(f"{case.label} at {case.level} did not decode exactly")
        stats = result.stats
        figures.append(LevelFigures(
            text=case.label, level=case.level, tokens=len(tokens),
            tokens_sha256=_sha256_tokens(tokens), code_bits=stats.code_bits,
            residual_bits=stats.residual_bits, residual_escapes=stats.residual_escapes,
            file_bytes=stats.file_bytes, encode_forwards=stats.forwards,
            decode_forwards=decoded.stats.forwards))
    return figures


def profile_key(model: CausalLM) -> str:
    """A file-name-safe key of everything the model-coded figures depend on besides the code.

    The CPU's vendor, family and model (its kernels' code paths; the profile's
    ``seqkv.schedule.cpu_model``), the CPU capability torch dispatches to, the row-invariant
    forward's calibrated row block, and the torch and transformers versions.
    """
    profile = model.profile("rows")
    parts = [profile.cpu_model, profile.cpu_capability, f"block{row_forward(model).row_block}",
             f"torch{profile.torch_version}", f"transformers{profile.transformers_version}"]
    return re.sub(r"[^A-Za-z0-9.]+", "-", "_".join(parts)).strip("-").lower()


def baseline_path(key: str, root: Path = BASELINE_DIR) -> Path:
    return root / f"{key}.json"


def write_baseline(path: Path, key: str, model: CausalLM, figures: Sequence[LevelFigures]) -> None:
    """Record ``figures`` as the baseline of profile ``key`` (one object per line, sorted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted((asdict(f) for f in figures), key=lambda r: (r["text"], r["level"]))
    lines = [json.dumps({"profile": key, "model": model.name,
                         "model_weights_sha256": model.identity.weights_sha256}, sort_keys=True)]
    lines += [json.dumps(row, sort_keys=True) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def read_baseline(path: Path) -> list[LevelFigures]:
    if not path.is_file():
        raise MissingBaselineError(
            f"no baseline of deterministic figures for this execution profile ({path.stem}): "
            f"record one with `{RECORD_COMMAND}` and commit {path}"
        )
    lines = path.read_text().splitlines()
    return [LevelFigures(**json.loads(line)) for line in lines[1:] if line.strip()]


def baseline_row(model: CausalLM, tokens: Sequence[int], level: str,
                 root: Path = BASELINE_DIR) -> LevelFigures | None:
    """The committed figures of exactly these tokens at ``level`` on this profile, if any."""
    path = baseline_path(profile_key(model), root)
    if not path.is_file():
        return None
    digest = _sha256_tokens(tokens)
    return next((row for row in read_baseline(path)
                 if row.tokens_sha256 == digest and row.level == level), None)


def compare_figures(baseline: Sequence[LevelFigures],
                    current: Sequence[LevelFigures]) -> list[FigureChange]:
    """Every figure that differs, and every (text, level) present on one side only."""
    old = {f.key: f for f in baseline}
    new = {f.key: f for f in current}
    changes = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        for field in fields(LevelFigures):
            if field.name in ("text", "level"):
                continue
            a = getattr(before, field.name) if before is not None else None
            b = getattr(after, field.name) if after is not None else None
            if a != b:
                changes.append(FigureChange(key[0], key[1], field.name, a, b))
    return changes


def render_changes(changes: Sequence[FigureChange], key: str) -> str:
    """The old / new / delta table a failing gate prints."""
    lines = [f"deterministic figures differ from the baseline of profile {key}:",
             "| text | level | figure | old | new | delta |", "|---|---|---|---:|---:|---:|"]
    for c in changes:
        delta = (f"{c.new - c.old:+,}" if isinstance(c.old, int) and isinstance(c.new, int)
                 else "")
        lines.append(f"| {c.text} | {c.level} | {c.figure} | {c.old} | {c.new} | {delta} |")
    lines.append(f"If the change is intended, run `{RECORD_COMMAND}` and commit the baseline.")
    return "\n".join(lines)

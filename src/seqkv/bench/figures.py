"""Deterministic figures of every coding level, gated exactly against committed baselines.

Code lengths, file sizes, residual sizes and forward counts are deterministic: the same code on
the same inputs gives the same numbers, to the bit. So the test command compares them exactly
with baselines shipped in the package (``seqkv/data/baselines/figures/``), and any change (a
better coder, a regression, a format change) shows as a table of old / new / delta that a
reviewer reads in the diff of the baseline file. Timings are not here (``seqkv.bench.timing``).

What a figure depends on decides which baseline gates it:

- **Integer figures** (``INTEGER_LEVELS``: ``portable``, ``ngram``, ``plain``, each coded from the
  tokens alone, so no float KV residual enters the file): integer arithmetic end to end, the same
  bits on every machine. ONE baseline (``integer.json``), gated exactly everywhere: a difference
  is a portability bug or a change of the code, and fails naming the rows.
- **Float figures** (``FLOAT_LEVELS``: ``tokens``, ``rows``, ``segments:4``, coded with the KV of
  one prefill and its residual): they follow the float bits of the model's logits, so one
  baseline per ``FloatProfile`` (``float/<key>.json``). Measured on two machines: an Intel
  (family 6, models 207 and 167) and an AMD EPYC (family 26) CPU, all AVX-512, gave identical
  integer figures and different float figures; the two Intel models gave identical float figures
  with the same row block (16), the AMD one had row block 4. So the key holds what decides those
  bits, not a CPU model number: the CPU vendor (which kernels the BLAS dispatches to), torch's
  CPU capability (the ISA level it dispatches to), the row-invariant forward's calibrated row
  block, and the torch and transformers versions. Thread counts are fixed per schedule
  (``seqkv.schedule``), so they are not a machine variable. On a profile without a float baseline
  the float figures are reported as not gated, with their differences from the nearest recorded
  profile, never dropped and never a failure for a missing file.

Invariants:
1. ``measure_figures`` decodes every file it codes and raises unless the tokens come back
   exactly (enforced; ``decompress`` also verifies the checksums).
2. ``compare_figures`` reports every field that differs, with no tolerance (enforced).
3. A baseline names the texts by the SHA-256 of their tokens, so a changed text or tokenizer is a
   changed figure too (enforced: ``tokens_sha256`` is a gated field).
4. Baselines are found in the installed package, never relative to the working directory
   (enforced: ``baselines_root``).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

import numpy as np

from seqkv.bench.texts import TEXT_FILES, shipped_text
from seqkv.codec import DEFAULT_TOLERANCE, PrefillKV
from seqkv.errors import CorruptFileError, DecodeVerificationError, SeqKVError
from seqkv.levels import DEFAULT_LEVEL, parse_level
from seqkv.models.adapter import CausalLM
from seqkv.models.rows import row_forward
from seqkv.schedule import cpu_vendor
from seqkv.skv import compress, decompress

# NOTE: 96 tokens of each kind keep the whole gate (every level coded and decoded) near three
# minutes on a 2-core CPU, long enough for every level to reach its steady state (the rows
# level's drafts, four segments of 24 tokens).
GATE_TOKENS = 96
FLOAT_LEVELS = ("tokens", "rows", "segments:4")
INTEGER_LEVELS = ("ngram", "plain", "portable", "portable4")
Dependence = Literal["integer", "float"]


@dataclass(frozen=True)
class GateCase:
    """One text (its first ``tokens`` tokens, or all of it) coded at one level: with the KV of
    one prefill (a float level, whose file then holds a residual) or from the tokens alone (an
    integer level: nothing float enters the file)."""

    kind: str
    tokens: int | None
    level: str

    @property
    def label(self) -> str:
        return self.kind if self.tokens is not None else f"{self.kind}-full"

    @property
    def dependence(self) -> Dependence:
        return dependence(self.level)


def dependence(level: str) -> Dependence:
    """``integer`` for a level whose figures are the same on every machine, else ``float``."""
    spec = parse_level(level).spec
    return "integer" if spec.portable or not spec.model_coded else "float"


# Every level on 96 tokens of every kind, and the whole prose sample at the default level: the
# text ``scripts/test.sh`` runs ``seqkv check`` on, whose code length the check gates too.
GATE_CASES = (*(GateCase(kind, GATE_TOKENS, level) for kind in TEXT_FILES
                for level in (*FLOAT_LEVELS, *INTEGER_LEVELS)),
              GateCase("prose", None, DEFAULT_LEVEL))
RECORD_COMMAND = "seqkv bench figures --record"
INTEGER_BASELINE = "integer.json"
FLOAT_FOLDER = "float"
# The portable promise, re-checked on every machine that runs the tests: the whole prose sample
# coded at ``portable`` from its tokens alone is this file, byte for byte.
REFERENCE_FILE = "portable-sample.skv"


class MissingBaselineError(SeqKVError):
    """A committed baseline that must exist (the integer one) is missing or unreadable."""


def baselines_root() -> Path:
    """The folder of the committed baselines, inside the installed package."""
    return Path(str(importlib.resources.files("seqkv") / "data" / "baselines" / "figures"))


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


@dataclass(frozen=True)
class FloatProfile:
    """What decides the bits of the float levels' figures on a machine (module docstring)."""

    vendor: str
    cpu_capability: str
    row_block: int
    torch_version: str
    transformers_version: str

    @property
    def key(self) -> str:
        """A file-name-safe key, e.g. ``authenticamd-avx512-block4-torch2.13.0-cpu-...``."""
        parts = [self.vendor, self.cpu_capability, f"block{self.row_block}",
                 f"torch{self.torch_version}", f"transformers{self.transformers_version}"]
        return re.sub(r"[^A-Za-z0-9.]+", "-", "-".join(parts)).strip("-").lower()

    def differences(self, other: FloatProfile) -> list[str]:
        """``field: mine vs theirs`` for every field that differs."""
        return [f"{f.name}: {getattr(self, f.name)} vs {getattr(other, f.name)}"
                for f in fields(FloatProfile) if getattr(self, f.name) != getattr(other, f.name)]


def float_profile(model: CausalLM) -> FloatProfile:
    profile = model.profile("rows")
    return FloatProfile(cpu_vendor(), profile.cpu_capability, row_forward(model).row_block,
                        profile.torch_version, profile.transformers_version)


def tokens_sha256(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


def measure_figures(model: CausalLM, cases: Sequence[GateCase] = GATE_CASES,
                    tolerance: float = DEFAULT_TOLERANCE) -> list[LevelFigures]:
    """Code every case (float levels with the KV of one prefill, integer levels from the tokens
    alone), decode each file, and return the figures."""
    figures = []
    for case in cases:
        tokens = model.encode_text(shipped_text(case.kind))
        tokens = tokens if case.tokens is None else tokens[: case.tokens]
        # the float levels' KV: this machine's prefill, which the encoder runs (and shares)
        kv: PrefillKV | None = "prefill" if case.dependence == "float" else None
        result = compress(model, tokens, kv=kv, tolerance=tolerance, level=case.level)
        decoded = decompress(model, result.data)
        if decoded.tokens != tokens:
            raise DecodeVerificationError(f"{case.label} at {case.level} did not decode exactly")
        stats = result.stats
        figures.append(LevelFigures(
            text=case.label, level=case.level, tokens=len(tokens),
            tokens_sha256=tokens_sha256(tokens), code_bits=stats.code_bits,
            residual_bits=stats.residual_bits, residual_escapes=stats.residual_escapes,
            file_bytes=stats.file_bytes, encode_forwards=stats.forwards,
            decode_forwards=decoded.stats.forwards))
    return figures


@dataclass(frozen=True)
class Baseline:
    """One committed baseline file: its rows, and the float profile it belongs to (None for
    the integer baseline)."""

    path: Path
    profile: FloatProfile | None
    rows: tuple[LevelFigures, ...]


def write_baseline(path: Path, model: CausalLM, figures: Sequence[LevelFigures],
                   profile: FloatProfile | None, recorded_on: str) -> None:
    """Record ``figures`` (one JSON object per line, sorted; the first line describes them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted((asdict(f) for f in figures), key=lambda r: (r["text"], r["level"]))
    head: dict[str, object] = {"model": model.name,
                               "model_weights_sha256": model.identity.weights_sha256,
                               "recorded_on": recorded_on}
    if profile is not None:
        head["profile"] = asdict(profile)
    lines = [json.dumps(head, sort_keys=True), *(json.dumps(row, sort_keys=True) for row in rows)]
    path.write_text("\n".join(lines) + "\n")


def read_baseline(path: Path) -> Baseline:
    """A baseline file; ``CorruptFileError`` naming it when it cannot be read as one."""
    try:
        lines = [line for line in path.read_text("utf-8").splitlines() if line.strip()]
        head = json.loads(lines[0])
        profile = None if "profile" not in head else FloatProfile(**head["profile"])
        rows = tuple(LevelFigures(**json.loads(line)) for line in lines[1:])
    except (OSError, IndexError, ValueError, TypeError) as error:
        raise CorruptFileError(f"{path} is not a figures baseline: {error}") from error
    return Baseline(path, profile, rows)


def reference_file(model: CausalLM) -> bytes:
    """The shipped prose sample coded at ``portable`` from its tokens alone: the same bytes on
    every machine (no float enters the file; ``seqkv.digests.NO_PROFILE``)."""
    tokens = model.encode_text(shipped_text("prose"))
    return compress(model, tokens, level="portable").data


def integer_baseline_path(root: Path) -> Path:
    return root / INTEGER_BASELINE


def float_baseline_path(root: Path, profile: FloatProfile) -> Path:
    return root / FLOAT_FOLDER / f"{profile.key}.json"


def float_baselines(root: Path) -> list[Baseline]:
    return [read_baseline(path) for path in sorted((root / FLOAT_FOLDER).glob("*.json"))]


def nearest_baseline(profile: FloatProfile, recorded: Sequence[Baseline]) -> Baseline | None:
    """The recorded float baseline whose profile differs from ``profile`` in fewest fields."""
    scored = [(len(profile.differences(b.profile)), b.path.name, b) for b in recorded
              if b.profile is not None]
    return min(scored, key=lambda item: item[:2])[2] if scored else None


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


def render_changes(changes: Sequence[FigureChange], title: str) -> str:
    """The old / new / delta table of ``changes``."""
    lines = [title, "| text | level | figure | old | new | delta |", "|---|---|---|---:|---:|---:|"]
    for c in changes:
        delta = (f"{c.new - c.old:+,}" if isinstance(c.old, int) and isinstance(c.new, int)
                 else "")
        lines.append(f"| {c.text} | {c.level} | {c.figure} | {c.old} | {c.new} | {delta} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class GateReport:
    """The gate's verdict on one run: which figures were gated exactly, which not, and why."""

    integer_rows: int
    integer_changes: tuple[FigureChange, ...]
    float_profile: FloatProfile
    float_rows: int
    float_changes: tuple[FigureChange, ...] | None  # None: no baseline for this profile
    nearest: Baseline | None  # the closest recorded float profile, when this one has none
    nearest_changes: tuple[FigureChange, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.integer_changes and not self.float_changes

    @property
    def float_gated(self) -> bool:
        return self.float_changes is not None

    def render(self) -> str:
        key = self.float_profile.key
        lines = [
            f"integer figures ({self.integer_rows} rows, {', '.join(INTEGER_LEVELS)}): gated "
            f"exactly against {INTEGER_BASELINE}, the one baseline of every machine: "
            + ("equal" if not self.integer_changes else
               f"{len(self.integer_changes)} figures DIFFER (a portability bug or a change of "
               "the code)")]
        if self.float_changes is not None:
            lines.append(
                f"float figures ({self.float_rows} rows, {', '.join(FLOAT_LEVELS)}): gated "
                f"exactly against the baseline of profile {key}: "
                + ("equal" if not self.float_changes else
                   f"{len(self.float_changes)} figures DIFFER"))
        else:
            near = ("no float profile is recorded" if self.nearest is None else
                    f"nearest recorded profile {self.nearest.path.stem} (differs in "
                    + "; ".join(self.float_profile.differences(self.nearest.profile)
                                if self.nearest.profile is not None else [])
                    + f"): {len(self.nearest_changes)} of its figures differ here")
            lines.append(
                f"float figures ({self.float_rows} rows, {', '.join(FLOAT_LEVELS)}): NOT GATED on "
                f"this profile ({key}): no baseline is recorded for it; {near}. Record one with "
                f"`{RECORD_COMMAND}`.")
        if self.integer_changes:
            lines.append(render_changes(self.integer_changes, "integer figures that differ:"))
        if self.float_changes:
            lines.append(render_changes(self.float_changes, f"float figures that differ from "
                                        f"the baseline of {key}:"))
        if self.nearest_changes:
            lines.append(render_changes(self.nearest_changes, "float figures against the nearest "
                                        "recorded profile (not gated):"))
        if not self.passed:
            lines.append(f"If the change is intended, run `{RECORD_COMMAND}` and commit the "
                         "baselines with the diff explained.")
        return "\n".join(lines)


def gate(model: CausalLM, current: Sequence[LevelFigures],
         root: Path | None = None) -> GateReport:
    """Compare ``current`` with the integer baseline and this profile's float baseline."""
    root = baselines_root() if root is None else root
    integer_path = integer_baseline_path(root)
    if not integer_path.is_file():
        raise MissingBaselineError(f"the integer figures baseline {integer_path} is missing: it "
                                   f"ships with seqkv (record it with `{RECORD_COMMAND}`)")
    integer_now = [f for f in current if dependence(f.level) == "integer"]
    float_now = [f for f in current if dependence(f.level) == "float"]
    integer_changes = tuple(compare_figures(read_baseline(integer_path).rows, integer_now))
    profile = float_profile(model)
    path = float_baseline_path(root, profile)
    if path.is_file():
        float_changes = tuple(compare_figures(read_baseline(path).rows, float_now))
        return GateReport(len(integer_now), integer_changes, profile, len(float_now),
                          float_changes, None)
    nearest = nearest_baseline(profile, float_baselines(root))
    nearest_changes = () if nearest is None else tuple(compare_figures(nearest.rows, float_now))
    return GateReport(len(integer_now), integer_changes, profile, len(float_now), None, nearest,
                      nearest_changes)


def record(model: CausalLM, current: Sequence[LevelFigures], root: Path | None = None,
           recorded_on: str = "") -> list[Path]:
    """Write the integer baseline, this profile's float baseline and the portable reference
    file."""
    root = baselines_root() if root is None else root
    profile = float_profile(model)
    integer_path = integer_baseline_path(root)
    float_path = float_baseline_path(root, profile)
    write_baseline(integer_path, model, [f for f in current if dependence(f.level) == "integer"],
                   None, recorded_on)
    write_baseline(float_path, model, [f for f in current if dependence(f.level) == "float"],
                   profile, recorded_on)
    reference = root / REFERENCE_FILE
    reference.write_bytes(reference_file(model))
    return [integer_path, float_path, reference]


BaselineStatus = Literal["gated", "not gated on this profile", "no baseline row for these tokens"]


def _status(value: int | None) -> BaselineStatus:
    return "gated" if value is not None else "no baseline row for these tokens"


@dataclass(frozen=True)
class CommittedCodeBits:
    """What the baselines say of one coded text's code length.

    ``gated``: the code length a committed baseline holds for exactly these tokens at this level
    on this machine (integer levels: every machine), which must equal the measured one. When
    ``gated`` is None, ``status`` says why and ``nearest`` holds the nearest recorded profile's
    value (not a gate), if any.
    """

    status: BaselineStatus
    gated: int | None
    nearest: int | None
    baseline: str  # the file consulted (or the nearest profile's)


def committed_code_bits(model: CausalLM, tokens: Sequence[int], level: str,
                        root: Path | None = None) -> CommittedCodeBits:
    """The committed code length of exactly ``tokens`` coded at ``level``, as the gate sees it."""
    root = baselines_root() if root is None else root
    digest = tokens_sha256(tokens)

    def find(baseline: Baseline) -> int | None:
        return next((row.code_bits for row in baseline.rows
                     if row.tokens_sha256 == digest and row.level == level), None)

    if dependence(level) == "integer":
        path = integer_baseline_path(root)
        value = find(read_baseline(path)) if path.is_file() else None
        return CommittedCodeBits(_status(value), value, None, path.name)
    profile = float_profile(model)
    path = float_baseline_path(root, profile)
    if path.is_file():
        value = find(read_baseline(path))
        return CommittedCodeBits(_status(value), value, None, f"{FLOAT_FOLDER}/{path.name}")
    nearest = nearest_baseline(profile, float_baselines(root))
    near_value = None if nearest is None else find(nearest)
    return CommittedCodeBits("not gated on this profile", None, near_value,
                             "" if nearest is None else f"{FLOAT_FOLDER}/{nearest.path.name}")

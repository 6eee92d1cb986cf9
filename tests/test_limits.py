"""``seqkv.limits`` is the one module that defines a bound on input (its invariant 3), with the
values the readers and writers have always checked against."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from seqkv import limits

SRC = Path(__file__).resolve().parents[1] / "src" / "seqkv"
# A module-level name that reads as a bound: MAX_X, X_MAX, X_MIN_Y, X_LIMIT, ...
_BOUND_NAME = re.compile(r"(^|_)(MAX|MIN|LIMIT|CAP)(_|$)")
# Names that look like bounds and are not limits on input (``seqkv.limits``' docstring says
# why each kind stays where it is). Each must still exist, so a rename cannot hide behind it.
NOT_LIMITS: dict[str, str] = {
    # What bytes mean: changing one changes the bits a file holds.
    "blockhash.py:_LENGTH_LIMIT": "format: length prefixes are four bytes",
    "coding/ngram.py:_MAX_TOTAL": "model: the ngram table's weights fit the coder's total",
    "coding/residual_code.py:ALPHABET_LIMIT": "format",
    "coding/residual_code.py:MIN_SCALE": "format",
    "coding/residual_code.py:MAX_SCALE": "format",
    "coding/residual_code.py:MAX_TOLERANCE": "format",
    "coding/residual_code.py:MIN_TOLERANCE": "format",
    "delta/residual_coder.py:_MAX_FREQUENCY": "format",
    "formats/framing.py:_MAX_SECTIONS": "format: the section count is one byte",
    "mixing/fixedpoint.py:STRETCH_LIMIT": "format",
    "mixing/mixer.py:_WEIGHT_LIMIT": "format",
    "models/integer/blocks.py:_SCALE_LIMIT": "format",
    "models/integer/blocks.py:_SUM_LIMIT": "format",
    "models/integer/blocks.py:ACTIVATION_LIMIT": "format",
    "models/integer/fixedpoint.py:MAX_SHIFT": "format",
    "models/integer/fixedpoint.py:RSQRT_MIN": "format",
    "models/integer/fixedpoint.py:RSQRT_MAX": "format",
    "models/integer/table.py:_MAX_GAP": "format",
    "models/integer/weights.py:MAX_REDUCTION": "format",
    # A coding model's parameter.
    "mixing/match.py:MAX_MATCH": "model: the match length's clamp",
    # Tuning: how fast, not what is accepted.
    "kvcache.py:MIN_HEADROOM": "tuning",
    "levels/portable.py:MAX_DRAFT": "tuning",
    "levels/portable.py:DRAFT_MIN_NGRAM": "tuning",
    "models/integer/threads.py:MAX_NATIVE_THREADS": "tuning",
    "models/integer/threads.py:MAX_EXPLORE_EVERY": "tuning",
    "models/rows.py:_PROBE_MAX_OUTPUTS": "tuning",
    "quantizers/lloyd_max.py:_MAX_ITERATIONS": "tuning: the solver's iterations",
    "bench/timing.py:MIN_THRESHOLD": "tuning: the timing gate's thresholds",
    "bench/timing.py:MAX_THRESHOLD": "tuning: the timing gate's thresholds",
    # native.c's buffers, stated beside the C source they mirror.
    "models/integer/forward.py:_NATIVE_MAX_HEAD_DIM": "native.c",
}


def bound_names(source: str) -> list[str]:
    """Module-level names in ``source`` that are assigned and read as bounds."""
    names = []
    for node in ast.parse(source).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names += [t.id for t in targets if isinstance(t, ast.Name) and _BOUND_NAME.search(t.id)]
    return names


def stray_bounds(root: Path) -> list[str]:
    """``path:NAME`` of every bound defined outside ``seqkv/limits.py`` and not listed."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == "limits.py":
            continue
        found += [f"{relative}:{name}" for name in bound_names(path.read_text())]
    return [entry for entry in found if entry not in NOT_LIMITS]


def test_no_module_but_limits_defines_a_bound() -> None:
    assert stray_bounds(SRC) == []


def test_every_listed_exception_still_exists() -> None:
    for entry in NOT_LIMITS:
        relative, name = entry.split(":")
        assert name in bound_names((SRC / relative).read_text()), entry


def test_a_bound_defined_in_another_module_is_caught(tmp_path: Path) -> None:
    """The mutant: a module of the package that defines its own cap again."""
    (tmp_path / "limits.py").write_text("MAX_SEGMENTS = 64\n")
    (tmp_path / "levels").mkdir()
    (tmp_path / "levels" / "segments.py").write_text(
        "from seqkv.limits import MAX_VOCAB\nMAX_SEGMENTS = 64\n_ENTRY_LIMIT = 1 << 16\n"
        "segments: int = 2\n")
    assert stray_bounds(tmp_path) == ["levels/segments.py:MAX_SEGMENTS",
                                      "levels/segments.py:_ENTRY_LIMIT"]


@pytest.mark.parametrize(("name", "value"), [
    ("MAX_SEGMENTS", 64), ("MAX_LAYERS", 1024), ("MODEL_FREE_MAX_TOKENS", 1 << 17),
    ("MAX_MODEL_FREE_WORK", 1 << 28), ("MODEL_FREE_MAX_VOCAB", 1 << 18),
    ("LEGACY_SKV_HEADER_BYTES", 64 * 1024), ("LEGACY_SKV_HEADER_DEPTH", 4),
    ("LEGACY_SKV_STRING", 256), ("LEGACY_SKV_THREADS", 4096),
    ("MAX_WARM_GEOMETRY", 1 << 20), ("MAX_WARM_TOKENS", 1 << 24),
    ("MAX_CHAIN_SPANS", 1 << 16), ("MAX_SPAN_ID", (1 << 63) - 1), ("MAX_RECORD_BYTES", 1 << 30),
    ("MAX_SESSION_NAME_SUFFIX", 100), ("MAX_NAME_BYTES", 255),
    ("MAX_TEXT_BYTES_PER_POSITION", 64), ("MAX_DESCRIPTION_BYTES", 64 * 1024),
])
def test_the_gathered_bounds_keep_their_values(name: str, value: int) -> None:
    """Moving a bound here changed no reader: each has the value its module defined, but for
    ``MAX_MODEL_FREE_WORK``, which counts decode work now (``ModelFreeLevel.decode_work``, 2**28)
    where it counted tokens x vocabulary (2**32): changed on purpose with its unit."""
    assert getattr(limits, name) == value

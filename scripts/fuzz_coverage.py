"""Branch coverage of the file decoders only, from a coverage.py JSON report, as markdown.

Usage: ``python scripts/fuzz_coverage.py COVERAGE_JSON``, where the JSON comes from
``coverage run --branch ... -m pytest tests/test_fuzz_*.py`` then ``coverage json``. A module's
whole-file figure also counts its writers (which the fuzz tests' fixtures run, and the fuzzing
never aims at); this sums, per module, only the functions that read a file, listed below.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DECODERS: dict[str, tuple[str, ...]] = {
    "src/seqkv/formats/framing.py": (
        "read_varint", "decode_varint", "peek_version", "unframe", "SectionReader.__init__",
        "SectionReader.fail", "SectionReader.remaining", "SectionReader.take", "SectionReader.u8",
        "SectionReader.varint", "SectionReader.f32", "SectionReader.f64",
        "SectionReader.finite", "SectionReader.rest", "SectionReader.finish", "inflate",
        "json_depth", "_refuse_constant", "_unique_keys", "load_json"),
    "src/seqkv/formats/skv.py": (
        "read_skv", "_token_code", "_decode_header", "decode_residual_section",
        "_level_parts"),
    "src/seqkv/formats/skv_legacy.py": (
        "read_legacy", "_fail", "_object", "_int", "_number", "_str", "_sha256", "_list",
        "_show", "_parse", "_schedule", "_segments", "_kv_shape", "_residual", "upgraded"),
    "src/seqkv/mixing/dictionary.py": (
        "Dictionary.__init__", "Dictionary.from_bytes", "_read", "_read_format_1",
        "_token_width", "_token_dtype"),
    "src/seqkv/formats/span.py": ("read_frame", "read_span", "_version2", "_version1",
                                  "SpanRecord.__post_init__"),
    "src/seqkv/store/codecs.py": ("session_of", "ModelCodec.decode_many"),
}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: fuzz_coverage.py COVERAGE_JSON", file=sys.stderr)
        return 2
    files = json.loads(Path(argv[1]).read_text())["files"]
    lines = ["| decoder module | functions | statements covered | branches covered |",
             "|---|---|---|---|"]
    totals = [0, 0, 0, 0]
    for path, names in DECODERS.items():
        functions = files[path]["functions"]
        missing = [name for name in names if name not in functions]
        if missing:
            raise SystemExit(f"{path} has no function {missing}: update DECODERS")
        sums = [sum(functions[n]["summary"][key] for n in names)
                for key in ("covered_lines", "num_statements", "covered_branches",
                            "num_branches")]
        totals = [a + b for a, b in zip(totals, sums, strict=True)]
        lines.append(f"| {path.removeprefix('src/')} | {len(names)} | {sums[0]}/{sums[1]} "
                     f"({100 * sums[0] / sums[1]:.1f}%) | {sums[2]}/{sums[3]} "
                     f"({100 * sums[2] / max(1, sums[3]):.1f}%) |")
    lines.append(f"| **all decoders** | | {totals[0]}/{totals[1]} "
                 f"({100 * totals[0] / totals[1]:.1f}%) | {totals[2]}/{totals[3]} "
                 f"({100 * totals[2] / totals[3]:.1f}%) |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

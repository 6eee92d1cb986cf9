"""Summarize the fuzz suite's JSON tallies (``SEQKV_FUZZ_REPORT``) per file format, as markdown.

Usage: ``python scripts/fuzz_summary.py REPORT_FOLDER``. Each tally's name starts with its
format (``skv-``, ``trie-``, ``dictionary-``, ``store-``, ``metadata-``); the summary adds up
the cases and outcomes of every tally of a format and takes the maxima of time and memory
growth. Outcomes whose name starts with ``NOT SEQKV`` are exceptions that are not
``SeqKVError``s; a case that never returned is not in any tally (``scripts/fuzz.sh`` reports a
test that timed out).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = {"skv": ".skv sessions", "trie": "trie snapshots", "dictionary": "mixing dictionaries",
           "store": "store span records", "metadata": "store metadata (both backends)"}


@dataclass
class FormatSummary:
    """The tallies of one format, added up."""

    tallies: int = 0
    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    max_seconds: float = 0.0
    slowest: str = ""
    max_memory_growth: int = 0
    over_budget: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, tally: dict[str, object]) -> None:
        self.tallies += 1
        self.cases += int(str(tally["cases"]))
        outcomes = tally["outcomes"]
        assert isinstance(outcomes, dict)
        self.outcomes.update({str(k): int(v) for k, v in outcomes.items()})
        seconds = float(str(tally["max_seconds"]))
        if seconds > self.max_seconds:
            self.max_seconds, self.slowest = seconds, f"{tally['format']}: {tally['slowest']}"
        self.max_memory_growth = max(self.max_memory_growth,
                                     int(str(tally["max_memory_growth_bytes"])))
        self.over_budget += int(str(tally.get("over_budget_cases", 0)))
        failures = tally["failures"]
        assert isinstance(failures, list)
        self.failures += [str(f) for f in failures]


def summarize(folder: Path) -> dict[str, FormatSummary]:
    summaries: dict[str, FormatSummary] = {}
    for path in sorted(folder.glob("*.json")):
        tally = json.loads(path.read_text())
        prefix = str(tally["format"]).split("-", 1)[0]
        summaries.setdefault(prefix, FormatSummary()).add(tally)
    return summaries


def markdown(summaries: dict[str, FormatSummary]) -> str:
    lines = ["| format | tallies | cases | non-seqkv exceptions | wrong outputs | max s/case "
             "| cases over 2 s | max RSS growth |", "|---|---|---|---|---|---|---|---|"]
    for prefix, summary in summaries.items():
        foreign = sum(n for k, n in summary.outcomes.items() if k.startswith("NOT SEQKV"))
        lines.append(
            f"| {FORMATS.get(prefix, prefix)} | {summary.tallies} | {summary.cases:,} | "
            f"{foreign} | {summary.outcomes['WRONG OUTPUT']} | {summary.max_seconds:.3f} | "
            f"{summary.over_budget if prefix != 'skv' else 'n/a'} | "
            f"{summary.max_memory_growth / 2**20:.1f} MiB |")
    for prefix, summary in summaries.items():
        lines += ["", f"### {FORMATS.get(prefix, prefix)}: outcomes", ""]
        lines += [f"- {name}: {count:,}" for name, count in summary.outcomes.most_common()]
        lines.append(f"- slowest case: {summary.slowest} ({summary.max_seconds:.3f} s)")
        lines += [f"- failure: {failure}" for failure in summary.failures[:10]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: fuzz_summary.py REPORT_FOLDER", file=sys.stderr)
        return 2
    print(markdown(summarize(Path(argv[1]))), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

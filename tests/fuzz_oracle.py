"""Outcome labels for formats whose crafted files can be valid files of other content.

A dictionary carries no digest of its own content (the CRC-32 detects damage, it is not a
seal): a structural mutation with its checksum recomputed can be a valid file of another
dictionary, which the loader must accept. The fuzz tests of those
formats therefore split "the decode did not fail" in two: the original content, or another
valid file that re-saves to exactly its own bytes (the loaders' canonical form). Either way
the user-facing check (decoding a ``.skv`` file with what was loaded) must end in a
``SeqKVError`` or the original tokens and KV.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from test_fuzz_harness import BUDGET, Tally

ORIGINAL = "original output"
OTHER_VALID = "other valid content (canonical)"


@dataclass
class CountingTally(Tally):
    """A ``Tally`` that also counts the cases that ran past the budget's time (its JSON report
    says how many, beside the slowest)."""

    over_budget: int = 0

    def run(self, description: str, attempt: Callable[[], bool]) -> None:
        started = time.perf_counter()
        super().run(description, attempt)
        self.over_budget += time.perf_counter() - started > BUDGET.seconds

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "over_budget_cases": self.over_budget}


def run_case(tally: Tally, description: str, attempt: Callable[[], bool | str]) -> None:
    """``Tally.run`` where ``attempt`` may also return a label for an accepted non-original
    file (counted under that label instead of the original output)."""
    label: list[str] = []

    def wrapped() -> bool:
        result = attempt()
        if isinstance(result, str):
            label.append(result)
            return True
        return result

    tally.run(description, wrapped)
    if label:
        tally.outcomes[ORIGINAL] -= 1
        tally.outcomes[label[0]] += 1

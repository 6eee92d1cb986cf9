"""Outcome labels for formats whose crafted files can be valid files of other content.

A trie snapshot or a dictionary carries no digest of its own content (the CRC-32 detects
damage, it is not a seal): a structural mutation with its checksum recomputed can be a valid
file of another trie or dictionary, which the loader must accept. The fuzz tests of those
formats therefore split "the decode did not fail" in two: the original content, or another
valid file that re-saves to exactly its own bytes (the loaders' canonical form). Either way
the user-facing check (decoding a ``.skv`` file with what was loaded) must end in a
``SeqKVError`` or the original tokens and KV.
"""

from __future__ import annotations

from collections.abc import Callable

from test_fuzz_harness import Tally

ORIGINAL = "original output"
OTHER_VALID = "other valid content (canonical)"


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

"""Comments, docstrings and CLI help state invariants, bounds and reasons: no timing figures of a
day and no history narration (issue 47, point 4).

A timing measured on one machine under one load goes stale with the next machine, the next
load or the next change; it belongs in a report under ``reports/`` (``reports/code_notes.md``
holds the figures behind choices in the code), and what the code used to be belongs in the
commit log. The scan is deliberately small: a few patterns over every comment and docstring line
of ``src/seqkv`` (``tests/source_prose.py``) and over every verb's rendered ``--help``, with an
explicit allow-list of kept lines, each with its reason. Each allow-list entry must still match
a line (a stale entry fails), and each pattern is shown catching the defect it names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest

from source_prose import ProseLine, c_prose_of, cli_help_texts, package_prose, prose_of

_NUMBER = r"(?<![\w.])~?\d[\d,]*(?:\.\d+)?(?:\s?(?:-|to|vs\.?|against)\s?~?\d[\d,]*(?:\.\d+)?)?"
PATTERNS: dict[str, re.Pattern[str]] = {
    # a duration: "0.9 ms", "10.5-15 ms", "39.5 CPU s", "0.265 s against 0.295 s"; a bare "s"
    # needs a space before it ("2s" is twice s in a shift's comment)
    "timing": re.compile(_NUMBER + r"(?:\s?(?:ms|µs|us|ns)|\s(?:s|CPU s|sec|seconds?|minutes?"
                         r"|hours?))\b"),
    "throughput": re.compile(_NUMBER + r"\s?(?:tokens?|[KMG]i?B)/s\b"),
    "speed-up": re.compile(r"\b\d+(?:\.\d+)?\s?x (?:faster|slower)\b"),
    # what the code used to be; "is used to" (a purpose) is not history
    "history": re.compile(r"(?i)(?<!is )(?<!are )(?<!be )(?<!been )\bused to\b|\bformerly\b"
                          r"|\breverted\b|\bnow (?:writes|reads|uses|carries|runs|lives|returns"
                          r"|stores|takes|keeps|goes)\b|\bsince this (?:version|release)\b"
                          r"|\(was \d"),
    "issue number": re.compile(r"\bissues? #?\d+\b|(?<![\w&])#\d+\b"),
    # a commit hash: 7 to 12 hex digits with a digit and a letter, standing alone (a digest in
    # a doctest's output is quoted)
    "commit hash": re.compile(r"(?<![\w'\"./-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}"
                              r"(?![\w'\"])"),
}

# Kept lines: (file or CLI command, exact text in the line) -> why it stays.
ALLOWED: dict[tuple[str, str], str] = {
    ("src/seqkv/store/backends/redis_server.py", "SIGKILL after 10 s"):
        "a bound: the grace the code gives a test server before it kills it",
    ("src/seqkv/limits.py", "per-case budget of 2 s of CPU"):
        "a bound: the fuzz harness's per-case budget, which the model-free limits are set to fit",
    ("src/seqkv/levels/model_free.py", "fuzz harness's 2 s"):
        "a bound: the same per-case budget, cited where the level states its decode caps",
}


def _unallowed(where: str, text: str) -> str:
    """The line without the allow-listed fragments of its file: a figure added beside a kept
    one is still found."""
    for path, fragment in ALLOWED:
        if where == path:
            text = text.replace(fragment, "")
    return text


def findings(lines: Iterable[ProseLine]) -> list[str]:
    """Every line a pattern matches outside the allow-listed fragments, as ``path:line
    [pattern] 'match': text``."""
    found = []
    for line in lines:
        text = _unallowed(line.path, line.text)
        for name, pattern in PATTERNS.items():
            match = pattern.search(text)
            if match:
                found.append(f"{line.where()} [{name}] {match.group(0)!r}: {line.text}")
                break
    return found


def help_findings(texts: dict[str, str]) -> list[str]:
    found = []
    for command, text in texts.items():
        for name, pattern in PATTERNS.items():
            for match in pattern.finditer(text):
                context = text[max(0, match.start() - 60):match.end() + 30]
                if pattern.search(_unallowed(command, context)):
                    found.append(f"{command} [{name}] {match.group(0)!r}: ...{context}...")
    return found


@pytest.fixture(scope="module")
def prose() -> list[ProseLine]:
    return list(package_prose())


@pytest.fixture(scope="module")
def help_texts() -> dict[str, str]:
    return cli_help_texts()


def test_src_prose_has_no_timings_or_history(prose: list[ProseLine]) -> None:
    assert len(prose) > 5_000  # the scan sees the package, not an empty folder
    found = findings(prose)
    assert not found, ("timing figures or history in src comments/docstrings (move the figure to "
                       "a report, keep the reason; or allow-list a bound with its reason):\n"
                       + "\n".join(found))


def test_cli_help_has_no_timings_or_history(help_texts: dict[str, str]) -> None:
    assert {"seqkv", "seqkv compress", "seqkv store put"} <= set(help_texts)
    found = help_findings(help_texts)
    assert not found, "timing figures or history in CLI help:\n" + "\n".join(found)


def test_every_allowed_line_still_exists(prose: list[ProseLine]) -> None:
    """A kept line that is gone (reworded, deleted) leaves a stale entry: drop it."""
    stale = [key for key in ALLOWED
             if not any(line.path == key[0] and key[1] in line.text for line in prose)]
    assert not stale, f"allow-list entries that match no line: {stale}"


# -- the guard fails on the defects it names ---------------------------------------------------

@pytest.mark.parametrize(("phrase", "pattern"), [
    ("entries: 0.9 ms vs 5.1 ms).", "timing"),
    ("medians 0.265-0.278 s kept against 0.295-0.396 s", "timing"),
    ("4 continuations cost 39.5 CPU s of a check", "timing"),
    ("no progress in 8 minutes", "timing"),
    ("a call costs ~13 us at 16 keys", "timing"),
    ("fell from ~70 to ~11 tokens/s", "throughput"),
    ("index_select is 5x faster than advanced indexing", "speed-up"),
    ("about 25x slower to encode", "speed-up"),
    ("each of them used to reach into Llama's module names", "history"),
    ("the first load now writes what transformers made of it", "history"),
    ("Format 5 (written since this version) is format 4", "history"),
    ("products at 21 GB/s (was 14)", "history"),
    ("(issue 29)", "issue number"),
    ("see #46", "issue number"),
    ("not worth its 150 lines of C (0fa3781, reverted by 0429f57)", "commit hash"),
])
def test_each_pattern_catches_its_defect(phrase: str, pattern: str) -> None:
    assert PATTERNS[pattern].search(phrase), (pattern, phrase)


@pytest.mark.parametrize("phrase", [
    "eps' = term >> 2s",  # a shift, not seconds
    "the digest is used to key the row",  # a purpose, not history
    "whether the budget now holds",  # a state, not history
    ">>> block_hash(...).hex()[:16]\n'9f6154e9c34c08c7'",  # a digest in a doctest's output
    "the 2 planes of 64 rows",
])
def test_patterns_leave_invariants_alone(phrase: str) -> None:
    assert not [name for name, p in PATTERNS.items() if p.search(phrase)], phrase


def test_a_timing_comment_and_docstring_are_reported() -> None:
    """Feed the defect: a module whose comment and docstring carry figures is reported on both
    lines; a figure in code or inside a string is not prose and is left alone."""
    source = ('"""A module.\n\nThe loop ran 0.9 ms vs 5.1 ms here.\n"""\n'
              'x = "took 3 s"  # faster: 82 ms fresh vs 17 ms\n'
              'def f() -> None:\n    """Used to run in 2 seconds."""\n')
    found = findings(prose_of(source, "src/seqkv/fake.py"))
    assert [f.split(" ")[0] for f in found] == ["src/seqkv/fake.py:5", "src/seqkv/fake.py:3",
                                                "src/seqkv/fake.py:7"]


def test_the_allow_list_keeps_only_its_exact_line() -> None:
    """An allowed bound keeps its line only: the same file with another figure is reported."""
    kept = ProseLine("src/seqkv/store/backends/redis_server.py", 1,
                     '"""Stop the server: SIGTERM, then SIGKILL after 10 s."""', "docstring")
    other = ProseLine("src/seqkv/store/backends/redis_server.py", 2,
                      "# a start took 3.2 s here", "comment")
    assert findings([kept]) == []
    assert len(findings([other])) == 1
    beside = ProseLine("src/seqkv/store/backends/redis_server.py", 3,
                       "# SIGKILL after 10 s; a start took 3.2 s here", "comment")
    assert len(findings([beside])) == 1  # a new figure beside a kept one


def test_help_with_figures_is_reported() -> None:
    """Feed the defect to the help scan: the old ``--level`` help's figures are reported."""
    old = ("--level LEVEL rate-compute dial: portable (default: integer predictor; encode about "
           "2x one prefill), tokens (within 0.4% of portable's bits, about 25x slower to encode)")
    assert help_findings({"seqkv compress": old})


def test_a_timing_in_c_comments_is_reported() -> None:
    """Feed the defect to the C scan: the figure in a block comment is reported on its line."""
    source = "/* a step.\n * 1 row 11.3 ms direct vs 14.0 laid out */\nint x = 1; // fine\n"
    assert [f.split(" ")[0] for f in findings(c_prose_of(source, "src/seqkv/a.c"))] == [
        "src/seqkv/a.c:2"]

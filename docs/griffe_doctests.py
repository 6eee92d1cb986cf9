"""Griffe extension: a docstring's doctest blocks render as Python console code.

seqkv's docstrings carry doctests as the standard library's ``doctest`` reads them (a ``>>>``
line, its ``...`` continuations and the expected output, up to a blank line), not under a
Markdown fence. Read as Markdown, such a block is a paragraph: its output can parse as a link
(``[x]`` after ``[y]``) and its prompts as quotes. This wraps each block in a ``pycon`` fence
when the API reference is built; the docstrings themselves are not changed.

Invariants:
1. A block inside a fence already, or indented as Markdown code (4 spaces or more), is left
   as it is (enforced), so no block is fenced twice.
2. Only the text griffe renders changes; the source, which the doctests run, does not.
"""

from __future__ import annotations

from typing import Any

import griffe

_PROMPT = ">>>"
_FENCE = "```"


def fence_doctests(text: str) -> str:
    """``text`` with each top-level doctest block inside a ``pycon`` fence."""
    lines = text.split("\n")
    out: list[str] = []
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith(_FENCE):
            in_fence = not in_fence
        if in_fence or not stripped.startswith(_PROMPT) or len(indent) >= 4:
            out.append(line)
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].strip():
            end += 1
        out.append(f"{indent}{_FENCE}pycon")
        out.extend(lines[i:end])
        out.append(f"{indent}{_FENCE}")
        i = end
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Rewrites the docstring of every object griffe loads (``fence_doctests``)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and _PROMPT in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)

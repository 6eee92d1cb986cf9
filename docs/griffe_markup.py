"""Griffe extension: reStructuredText habits of seqkv's docstrings, rendered as Markdown.

seqkv's docstrings are written to read well as plain text and to run as doctests; the API
reference renders them as Markdown. Three habits would render wrongly, and are rewritten when the
reference is built (the docstrings themselves are not changed):

- A doctest block (a ``>>>`` line, its ``...`` continuations and expected output, up to a blank
  line) is a paragraph in Markdown: its prompts read as quotes and an output line can parse as a
  reference link (``[x]`` after ``[y]``), which fails the strict build. It is put in a ``pycon``
  fence.
- A Sphinx role (``:mod:`x```, ``:class:`~a.b.C```) shows its markup; it becomes inline code of
  its target (``~`` keeps the last component, as Sphinx does).
- A paragraph that ends in ``::`` before an indented literal block shows both colons; it keeps one.

Invariants:
1. A doctest block inside a fence already, or indented as Markdown code (4 spaces or more), is
   left as it is (enforced), so no block is fenced twice and the rewrite is idempotent.
2. Text inside fences is never rewritten (enforced).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_PROMPT = ">>>"
_FENCE = "```"
_ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


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


def rst_to_markdown(text: str) -> str:
    """``text`` with doctests fenced, Sphinx roles as inline code and literal ``::`` as ``:``."""
    lines = fence_doctests(text).split("\n")
    in_fence = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(_FENCE):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        line = _ROLE.sub(_role, line)
        followed_by_blank = i + 1 < len(lines) and not lines[i + 1].strip()
        if line.endswith("::") and followed_by_blank:
            line = line[:-1] if line.strip() != "::" else ""
        lines[i] = line
    return "\n".join(lines)


class RstMarkup(griffe.Extension):
    """Rewrites the docstring of every object griffe loads (``rst_to_markdown``)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)

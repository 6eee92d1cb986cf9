"""The prose of the package's source: every comment and every docstring-like string of
``src/seqkv``, line by line, with where it is.

Shared by ``test_comments.py`` (no timing figures or history in prose) and ``test_references.py``
(every dotted ``seqkv.`` name in prose resolves). Comments come from ``tokenize`` (so a ``#``
inside a string is not one); docstrings are every string constant standing alone as a statement
(module, class and function docstrings, and the attribute docstrings under dataclass fields),
from ``ast``, each line with its own line number.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "seqkv"


@dataclass(frozen=True)
class ProseLine:
    """One line of a comment or docstring: its file (relative to the checkout), line and text."""

    path: str
    line: int
    text: str
    kind: str  # "comment" or "docstring"

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def prose_of(source: str, path: str) -> Iterator[ProseLine]:
    """The comment and docstring lines of one module's ``source``."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield ProseLine(path, token.start[0], token.string.lstrip("#").strip(), "comment")
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            lines = source.splitlines()[node.lineno - 1:node.end_lineno]
            for offset, text in enumerate(lines):
                yield ProseLine(path, node.lineno + offset, text.strip(), "docstring")


def package_prose(root: Path = SRC) -> Iterator[ProseLine]:
    """Every comment and docstring line under ``root``, in path order."""
    for file in sorted(root.rglob("*.py")):
        yield from prose_of(file.read_text(encoding="utf-8"), str(file.relative_to(ROOT)))

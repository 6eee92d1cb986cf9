"""The prose of the package's source: every comment and every docstring-like string of
``src/seqkv`` (and the comments of its C source), line by line, with where it is.

Shared by ``test_comments.py`` (no timing figures or history in prose) and ``test_references.py``
(every dotted ``seqkv.`` name in prose resolves). Comments come from ``tokenize`` (so a ``#``
inside a string is not one); docstrings are every string constant standing alone as a statement
(module, class and function docstrings, and the attribute docstrings under dataclass fields),
from ``ast``, each line with its own line number.
"""

from __future__ import annotations

import ast
import io
import re
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


_C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


def c_prose_of(source: str, path: str) -> Iterator[ProseLine]:
    """The comment lines of one C file's ``source`` (``/* */`` blocks and ``//`` lines)."""
    for match in _C_COMMENT.finditer(source):
        first = source.count("\n", 0, match.start()) + 1
        for offset, text in enumerate(match.group(0).splitlines()):
            yield ProseLine(path, first + offset, text.strip(), "comment")


def package_prose(root: Path = SRC) -> Iterator[ProseLine]:
    """Every comment and docstring line of the Python and C files under ``root``, in path
    order."""
    for file in sorted([*root.rglob("*.py"), *root.rglob("*.c")]):
        text, where = file.read_text(encoding="utf-8"), str(file.relative_to(ROOT))
        yield from (c_prose_of if file.suffix == ".c" else prose_of)(text, where)


def cli_help_texts() -> dict[str, str]:
    """What ``seqkv --help`` and each verb's ``--help`` print, by command line (``"seqkv store
    put"``), rendered by the CLI's own argparse parsers, its whitespace runs (argparse wraps
    to the terminal's width) each one space."""
    import argparse

    from seqkv import cli

    texts: dict[str, str] = {}

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        texts[command] = " ".join(parser.format_help().split())
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{command} {name}")

    walk(cli.build_parser(), "seqkv")
    return texts

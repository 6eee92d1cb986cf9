"""What the tests of the reports ask of a generator's source (shared by test_provenance and
test_readme_figures)."""

from __future__ import annotations

import ast


def calls_start_run(source: str) -> bool:
    """Whether the source calls ``seqkv.provenance.start_run`` (under that name), anywhere."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", None)
            if name == "start_run":
                return True
    return False

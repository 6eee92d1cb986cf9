"""The package's dependency rules, checked on the source: no cycle between packages, the shared
modules depend on nothing heavy, the proofs import the core and never the reverse."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "seqkv"
# Subpackages and top-level modules that may import the symbolic proofs: the checker reads
# them, the proofs themselves and the CLI that runs the checker.
PROOF_READERS = {"checker", "proofs", "cli"}


def _unit(module: str) -> str:
    """The package-level unit of a ``seqkv.x.y`` module: ``x``."""
    return module.split(".")[1]


def _imports() -> dict[str, set[str]]:
    """Module-level (not function-level) imports between seqkv units, from the source."""
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(relative.parts).removesuffix(".__init__")
        if name == "seqkv":
            continue
        unit = _unit(name)
        tree = ast.parse(path.read_text())
        for node in tree.body:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            elif isinstance(node, ast.ImportFrom) and node.level > 0 and "proofs" in path.parts:
                targets = ["seqkv.proofs"]
            for target in targets:
                if target.startswith("seqkv.") and _unit(target) != unit:
                    graph.setdefault(unit, set()).add(_unit(target))
    return graph


def test_no_import_cycle_between_packages() -> None:
    graph = _imports()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(unit: str) -> None:
        state[unit] = 1
        path.append(unit)
        for other in sorted(graph.get(unit, ())):
            if state.get(other) == 1:
                cycle = [*path[path.index(other):], other]
                pytest.fail("import cycle between packages: " + " -> ".join(cycle))
            if other not in state:
                visit(other)
        path.pop()
        state[unit] = 2

    for unit in sorted(graph):
        if unit not in state:
            visit(unit)


def test_only_the_checker_reads_the_proofs() -> None:
    graph = _imports()
    readers = {unit for unit, targets in graph.items() if "proofs" in targets}
    assert readers <= PROOF_READERS


@pytest.mark.parametrize("module", ["seqkv.types", "seqkv.digests", "seqkv.framing",
                                    "seqkv.container", "seqkv.descriptions"])
def test_shared_modules_import_neither_torch_nor_transformers(module: str) -> None:
    code = (f"import sys, {module}; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'transformers')))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True).stdout.strip()
    assert loaded == "[]"

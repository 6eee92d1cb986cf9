"""The package's dependency rules, checked on the source: data flows one way (model -> levels ->
codec -> formats / store), no import goes from a lower layer to a higher one, no cycle between
packages, the shared modules depend on nothing heavy, the proofs import the core and never the
reverse, the store's path passes through the coded session and its span format only, and
nothing installed imports the lab (``research/``) or the benchmarks."""

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
# Top-level packages of the checkout that are not installed: the lab and the benchmarks.
OUTSIDE = {"research", "benchmarks"}
# Every unit's layer: a unit imports units of its layer or below, never above. The values and
# their byte layouts sit low (a file is read without the model); the model, the levels, the
# codec, then what builds on the codec (the trie, the store, layer 2), then what measures and
# what a user runs.
LAYERS: dict[str, int] = {
    **dict.fromkeys(("errors", "limits", "types", "digests", "files", "version", "namespaces",
                     "progress", "environment", "eviction", "blockhash"),
                    0),
    **dict.fromkeys(("coding", "session", "schedule", "kvcache"), 1),
    **dict.fromkeys(("formats", "descriptions"), 2),
    **dict.fromkeys(("models", "kernels", "mixing", "quantizers"), 3),
    "levels": 4,
    **dict.fromkeys(("bounds", "codec"), 5),
    **dict.fromkeys(("trie", "store", "delta", "warm", "integrations"), 6),
    **dict.fromkeys(("bench", "checker", "proofs", "provenance"), 7),
    **dict.fromkeys(("cli", "__main__"), 8),
}


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


def test_every_unit_has_a_layer() -> None:
    units = {path.relative_to(SRC).parts[0].removesuffix(".py") for path in SRC.glob("*")
             if path.name != "__init__.py" and (path.suffix == ".py" or path.is_dir())
             and path.name not in ("py.typed", "data", "__pycache__")}
    assert units <= set(LAYERS), sorted(units - set(LAYERS))


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    upward = sorted(f"{unit} ({LAYERS[unit]}) -> {target} ({LAYERS[target]})"
                    for unit, targets in _imports().items() for target in targets
                    if LAYERS[target] > LAYERS[unit])
    assert not upward, upward


def _module_imports(path: Path) -> set[str]:
    """Every ``seqkv`` module one file imports, at any level of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("seqkv")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("seqkv"):
            found.add(node.module)
    return found


def test_the_store_and_the_levels_do_not_pass_through_the_skv_file_or_the_trie() -> None:
    """A store put and get walk the coded session and its span format only, and find prefixes
    through the trie (its hot tier and prefix index), which never reaches back into the store;
    levels take the neutral prefix type, not the trie's."""
    for unit, banned in (("store", ("seqkv.formats.skv",)),
                         ("trie", ("seqkv.store",)),
                         ("levels", ("seqkv.trie", "seqkv.formats"))):
        for path in (SRC / unit).rglob("*.py"):
            bad = sorted(m for m in _module_imports(path) if m.startswith(banned))
            assert not bad, f"{path.relative_to(SRC)} imports {bad}"


def _outside_imports(root: Path) -> list[str]:
    """``file: module`` for every import of the lab or the benchmarks under ``root``."""
    return sorted(f"{path.relative_to(root)}: {module}" for path in root.rglob("*.py")
                  for module in _all_imports(path) if module.split(".")[0] in OUTSIDE)


def _all_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_package_imports_neither_the_lab_nor_the_benchmarks() -> None:
    """What moved out of ``src/seqkv`` (``research.bench``) is not needed by what is installed."""
    assert _outside_imports(SRC) == []


def test_an_import_of_the_lab_is_caught(tmp_path: Path) -> None:
    """The mutant: a package module that reaches back into what moved out, at any depth."""
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "bench.py").write_text(
        "def run() -> None:\n    from research.bench.decode import run_decode_bench\n")
    (tmp_path / "codec.py").write_text("import benchmarks.bench_ratios\nimport seqkv.limits\n")
    assert _outside_imports(tmp_path) == ["cli/bench.py: research.bench.decode",
                                          "codec.py: benchmarks.bench_ratios"]


def test_only_the_checker_reads_the_proofs() -> None:
    graph = _imports()
    readers = {unit for unit, targets in graph.items() if "proofs" in targets}
    assert readers <= PROOF_READERS


@pytest.mark.parametrize("module", ["seqkv.types", "seqkv.digests", "seqkv.limits",
                                    "seqkv.eviction", "seqkv.session", "seqkv.formats.framing",
                                    "seqkv.formats.skv", "seqkv.formats.span",
                                    "seqkv.descriptions", "seqkv.namespaces"])
def test_shared_modules_import_neither_torch_nor_transformers(module: str) -> None:
    code = (f"import sys, {module}; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'transformers')))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True).stdout.strip()
    assert loaded == "[]"

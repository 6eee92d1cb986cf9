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
    # ``skv`` is the ``.skv`` file API over the codec, beside the other users of its values.
    **dict.fromkeys(("trie", "store", "delta", "warm", "integrations", "skv"), 6),
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


def banned_imports(root: Path, unit: str, banned: tuple[str, ...]) -> dict[str, list[str]]:
    """The modules each file of ``unit`` under ``root`` imports from ``banned``."""
    found = {}
    for path in sorted((root / unit).rglob("*.py")):
        if bad := sorted(m for m in _module_imports(path) if m.startswith(banned)):
            found[str(path.relative_to(root))] = bad
    return found


def test_the_levels_do_not_pass_through_the_trie_or_a_format() -> None:
    """Levels take the neutral prefix type, not the trie's, and write no bytes."""
    assert not banned_imports(SRC, "levels", ("seqkv.trie", "seqkv.formats"))


def test_the_trie_does_not_import_the_store() -> None:
    """The store finds prefixes through the trie (its hot tier and prefix index); the trie never
    reaches back into the store."""
    assert not banned_imports(SRC, "trie", ("seqkv.store",))


def test_a_trie_module_importing_the_store_is_caught(tmp_path: Path) -> None:
    (tmp_path / "trie").mkdir()
    (tmp_path / "trie" / "cache.py").write_text(
        "def f():\n    from seqkv.store.ids import SpanId\n    return SpanId\n")
    assert banned_imports(tmp_path, "trie", ("seqkv.store",)) == {
        "trie/cache.py": ["seqkv.store.ids"]}


# The ``.skv`` file API (``seqkv.skv``) and the functions of it that read or write file bytes;
# the modules that hold the ``.skv`` byte layout.
FILE_API = "seqkv.skv"
FILE_API_CALLS = frozenset({"compress", "decompress", "decompress_batch", "decompress_tokens",
                            "upgrade"})
SKV_FORMATS = ("seqkv.formats.skv",)  # and ``seqkv.formats.skv_legacy``: a prefix match
# Units whose values are coded sessions or their own formats, never ``.skv`` bytes.
SESSION_UNITS = ("store", "delta", "warm", "integrations")


def _is_skv_module(module: str) -> bool:
    return module == FILE_API or module.startswith((f"{FILE_API}.", *SKV_FORMATS))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def file_api_uses(source: str, *, calls: bool = True) -> list[str]:
    """Every use of the ``.skv`` file in one module's source, at any depth: an import of
    ``seqkv.skv`` or ``seqkv.formats.skv*`` (or of those modules from ``seqkv`` and
    ``seqkv.formats``), and with ``calls`` a call of the file API's ``compress``,
    ``decompress``, ``decompress_batch``, ``decompress_tokens`` or ``upgrade`` (``seqkv``
    re-exports them), whatever name it was imported as: ``seqkv.compress(...)``,
    ``files.decompress(...)`` after ``import seqkv.skv as files``. A method of another object
    of the same name (``zlib.compressobj().compress``) is no use of the file API."""
    found: list[str] = []
    bound: dict[str, str] = {}  # local name -> the dotted seqkv name it stands for
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("seqkv"):
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else local
                if _is_skv_module(alias.name):
                    found.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("seqkv"):
                continue
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            if _is_skv_module(node.module):
                found.append(f"from {node.module} import ...")
            elif node.module in ("seqkv", "seqkv.formats"):
                found += [f"from {node.module} import {a.name}" for a in node.names
                          if _is_skv_module(f"{node.module}.{a.name}")
                          or (calls and a.name in FILE_API_CALLS)]
    if not calls:
        return found
    api = {f"{module}.{name}" for module in ("seqkv", FILE_API) for name in FILE_API_CALLS}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (name := _dotted(node.func)) is not None:
            head, _, rest = name.partition(".")
            resolved = bound.get(head, head) + (f".{rest}" if rest else "")
            if resolved in api:
                found.append(f"call {name}() at line {node.lineno}")
    return found


def test_session_units_neither_call_the_file_api_nor_read_skv_bytes() -> None:
    """The store, layer 2, the warm tier and the connector take coded sessions (or their own
    format modules): none calls the file API or imports the ``.skv`` format."""
    bad = {f"{path.relative_to(SRC)}": uses for unit in SESSION_UNITS
           for path in sorted((SRC / unit).rglob("*.py"))
           if (uses := file_api_uses(path.read_text()))}
    assert not bad, bad


def test_the_codec_holds_no_file_format() -> None:
    """``seqkv.codec`` encodes and decodes coded sessions; the bytes are ``seqkv.skv``'s."""
    uses = file_api_uses((SRC / "codec.py").read_text(), calls=False)
    assert not uses, uses


@pytest.mark.parametrize(("source", "expected"), [
    ("from seqkv.skv import compress\n", ["from seqkv.skv import ..."]),
    ("import seqkv.skv\n", ["import seqkv.skv"]),
    ("from seqkv import compress\n", ["from seqkv import compress"]),
    ("from seqkv.formats import skv_legacy\n", ["from seqkv.formats import skv_legacy"]),
    ("def f() -> None:\n    from seqkv.formats.skv import read_skv\n",
     ["from seqkv.formats.skv import ..."]),
    ("import seqkv\nseqkv.decompress(m, b)\n", ["call seqkv.decompress() at line 2"]),
    ("import seqkv.skv as files\nfiles.upgrade(b'')\n",
     ["import seqkv.skv", "call files.upgrade() at line 2"]),
    ("def g(m, t):\n    from seqkv import compress as c\n    return c(m, t)\n",
     ["from seqkv import compress", "call c() at line 3"]),
    ("from seqkv.codec import encode\nencode(m, t)\n", []),
    ("from seqkv.formats.span import write_span\n", []),
    ("import zlib\nzlib.compressobj().compress(b'')\n", []),
])
def test_a_use_of_the_skv_file_is_caught(source: str, expected: list[str]) -> None:
    """The mutants: each way a module could reach the ``.skv`` file is reported, and what the
    session units may use (the codec's values, their own formats) is not."""
    assert file_api_uses(source) == expected


def test_a_session_unit_that_writes_skv_bytes_fails_the_check(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The whole check on a tree with one violating module, as ``store/hf.py`` was."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "hf.py").write_text(
        "from seqkv.skv import compress\n\ndef save(m, t):\n    return compress(m, t).data\n")
    (tmp_path / "codec.py").write_text("from seqkv.formats.skv import write_skv\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    with pytest.raises(AssertionError, match=r"store/hf\.py"):
        test_session_units_neither_call_the_file_api_nor_read_skv_bytes()
    with pytest.raises(AssertionError, match=r"seqkv\.formats\.skv"):
        test_the_codec_holds_no_file_format()


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
                                    "seqkv.formats.hf_cache",
                                    "seqkv.descriptions", "seqkv.namespaces"])
def test_shared_modules_import_neither_torch_nor_transformers(module: str) -> None:
    code = (f"import sys, {module}; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'transformers')))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True).stdout.strip()
    assert loaded == "[]"

"""Every dotted ``seqkv.`` name in the prose resolves to a real object (issue 47, point 4).

The prose is every comment and docstring of ``src/seqkv`` (``tests/source_prose.py``), the
README and the documentation (``docs/**/*.md``, when present). A name resolves when the longest
importable module prefix imports and ``getattr`` finds the rest, one attribute at a time; a
trailing ``()`` or punctuation is not part of a name. A module that imports a third-party
package the test environment lacks (the vLLM connector) is found by its source file, and the
rest of the name among the names that file defines at top level.

Some dotted strings that start with ``seqkv.`` are persisted data, not references: the domain
tags of hashes and the identities of store codecs, written into stores and files. They are
exempt by exact string (``PERSISTED``), never renamed; each must appear in the package's source
as a literal, so the list cannot hide a stale reference.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import pytest

from source_prose import ROOT, SRC, ProseLine, package_prose, prose_of

# A dotted name: ``seqkv`` not preceded by a path or word character, nor opening a Markdown
# link's target (``[page](seqkv.md)`` names a file), then dotted parts (a hyphen is kept so that
# a tag such as ``seqkv.store.skv-adapter`` is matched whole).
NAME = re.compile(r"(?<![\w./-])(?<!\]\()seqkv(?:\.[A-Za-z_][\w-]*)+")

# Persisted strings that look like dotted names -> where they are data.
PERSISTED: dict[str, str] = {
    "seqkv.blockhash.root.v1": "blockhash.py: the block hash's root domain tag",
    "seqkv.trie.prefix.v1": "blockhash.py, trie/keys.py: the block hash's step tag (format-5 "
                            "files' prefix_hash)",
    "seqkv.store.binding.v1": "store/binding.py: the session binding's domain tag",
    "seqkv.store.index.v2": "store/index.py: the prefix index's key domain",
    "seqkv.store.namespace.v1": "store/ids.py: the namespace key's domain tag",
    "seqkv.store.skv-adapter": "store/codecs.py: a codec identity",
    "seqkv.store.model": "store/codecs.py: a codec identity",
    "seqkv.store.tokens": "store/codecs.py: a codec identity",
    "seqkv.store.portable-tokens": "store/codecs.py: a legacy codec identity",
}


def _markdown_lines() -> list[ProseLine]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [ProseLine(str(path.relative_to(ROOT)), number, text, "markdown")
            for path in files if path.is_file()
            for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]


def _top_level_names(path: Path) -> set[str]:
    """The names a module's source binds at top level (defs, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _import(module: str) -> ModuleType | Path | None:
    """The module, or its source file when importing it needs a third-party package that is
    not installed here, or None when there is no such module."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing == module or module.startswith(missing + ".") or missing == "seqkv" or (
                missing.startswith("seqkv.")):
            return None  # no such seqkv module, or it imports one that does not exist
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            return None
        return Path(spec.origin)


def unresolved(name: str) -> str | None:
    """Why ``name`` does not resolve, or None when it does."""
    if name in PERSISTED:
        return None
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return "not a Python name"
    for split in range(len(parts), 0, -1):
        found = _import(".".join(parts[:split]))
        if found is None:
            continue
        rest = parts[split:]
        if isinstance(found, Path):
            if rest and rest[0] not in _top_level_names(found):
                return f"{'.'.join(parts[:split])} defines no {rest[0]}"
            return None
        target: object = found
        for at, part in enumerate(rest):
            if not hasattr(target, part):
                return f"{'.'.join(parts[:split + at])} has no attribute {part!r}"
            target = getattr(target, part)
        return None
    return "no such module"


def stale_references(lines: Iterable[ProseLine]) -> list[str]:
    """Every dotted ``seqkv.`` name in ``lines`` that does not resolve, with where it is."""
    verdicts: dict[str, str | None] = {}
    stale = []
    for line in lines:
        for match in NAME.finditer(line.text):
            name = match.group(0).rstrip(".-")
            if name not in verdicts:
                verdicts[name] = unresolved(name)
            if verdicts[name] is not None:
                stale.append(f"{line.where()}: {name} ({verdicts[name]})")
    return stale


def test_every_seqkv_name_in_src_prose_resolves() -> None:
    stale = stale_references(package_prose())
    assert not stale, "stale seqkv. references in src comments/docstrings:\n" + "\n".join(stale)


def test_every_seqkv_name_in_readme_and_docs_resolves() -> None:
    lines = _markdown_lines()
    assert any(line.path == "README.md" for line in lines)
    stale = stale_references(lines)
    assert not stale, "stale seqkv. references in README/docs:\n" + "\n".join(stale)


def test_every_persisted_tag_is_data_in_the_source() -> None:
    """An exempt string is a literal of the package (a tag or identity it writes), not a name
    that was once a module: a stale entry fails."""
    source = "\n".join(path.read_text(encoding="utf-8") for path in SRC.rglob("*.py"))
    missing = [tag for tag in PERSISTED if f'"{tag}' not in source]
    assert not missing, f"exempt strings that are no literal of src/seqkv: {missing}"


# -- the guard fails on the defects it names ---------------------------------------------------

def test_a_bogus_name_in_a_docstring_is_reported() -> None:
    """Feed the defect: a module whose docstring and comment name missing objects."""
    source = ('"""See ``seqkv.nothing.here`` and ``seqkv.codec.no_such_function()``."""\n'
              "x = 1  # as seqkv.limits.MAX_LAYERS says; not seqkv.levels.ENCODE_CHUNK_ROWS.\n")
    stale = stale_references(prose_of(source, "src/seqkv/fake.py"))
    assert stale == [
        "src/seqkv/fake.py:2: seqkv.levels.ENCODE_CHUNK_ROWS "
        "(seqkv.levels has no attribute 'ENCODE_CHUNK_ROWS')",
        "src/seqkv/fake.py:1: seqkv.nothing.here (seqkv has no attribute 'nothing')",
        "src/seqkv/fake.py:1: seqkv.codec.no_such_function "
        "(seqkv.codec has no attribute 'no_such_function')",
    ]


@pytest.mark.parametrize("name", [
    "seqkv.compress", "seqkv.limits.MAX_LAYERS", "seqkv.formats.span.read_frame",
    "seqkv.store.backends.redis_server", "seqkv.store.binding.v1",
])
def test_real_names_and_persisted_tags_resolve(name: str) -> None:
    assert unresolved(name) is None


def test_a_persisted_tag_is_exempt_only_by_its_exact_string() -> None:
    """The exemption is exact: a tag of another version is a name like any other."""
    assert unresolved("seqkv.store.binding.v2") is not None
    assert unresolved("seqkv.store.skv-adapter2") == "not a Python name"


def test_a_module_that_needs_a_missing_package_is_resolved_by_its_source(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A module whose import fails on a third-party package is found by its file, and the rest
    of the name among its top-level names (a name it does not define still fails)."""
    package = tmp_path / "seqkv_fake_ext"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "needs.py").write_text("import not_installed_pkg_xyz\n\nclass Connector: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = _import("seqkv_fake_ext.needs")
        assert isinstance(found, Path)
        assert _top_level_names(found) == {"not_installed_pkg_xyz", "Connector"}
        assert _import("seqkv_fake_ext.missing") is None
    finally:
        sys.modules.pop("seqkv_fake_ext", None)


def test_a_module_importing_a_missing_seqkv_module_does_not_resolve(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only a third-party package may be missing: a seqkv module whose own import names a seqkv
    module that is gone is stale, not resolved by its source file."""
    real_import, real_spec = importlib.import_module, importlib.util.find_spec
    source = tmp_path / "fake_module.py"
    source.write_text("import seqkv.gone\n")

    def gone(name: str, package: str | None = None) -> ModuleType:
        if name == "seqkv.fake_module":
            raise ModuleNotFoundError("No module named 'seqkv.gone'", name="seqkv.gone")
        return real_import(name, package)

    def spec(name: str, package: str | None = None) -> object:
        if name == "seqkv.fake_module":
            return importlib.util.spec_from_file_location(name, source)
        return real_spec(name, package)

    monkeypatch.setattr(importlib, "import_module", gone)
    monkeypatch.setattr(importlib.util, "find_spec", spec)
    assert unresolved("seqkv.fake_module") is not None

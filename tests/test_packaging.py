"""Every folder of modules under ``src/seqkv`` is a package that a wheel ships.

pyproject discovers packages with setuptools' ``packages.find`` (``where = ["src"]``), which takes
only folders holding an ``__init__.py``: a folder of modules without one works in the editable
install (the import system reads it as a namespace package) but is missing from a wheel, and
griffe (the API reference of ``mkdocs.yml``) cannot document it.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import find_packages

SRC = Path(__file__).resolve().parents[1] / "src"


def unshipped_module_folders(src: Path) -> list[str]:
    """Dotted names of the folders under ``src`` that hold modules but that discovery skips."""
    found = set(find_packages(str(src)))
    missing: list[str] = []
    # followlinks: seqkv.proofs and seqkv.kernels are links into the package (pyproject's NOTE).
    for folder, dirs, names in os.walk(src, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.endswith(".egg-info"))
        here = Path(folder)
        if here == src or not any(n.endswith(".py") for n in names):
            continue
        dotted = ".".join(here.relative_to(src).parts)
        if dotted not in found:
            missing.append(dotted)
    return missing


def test_every_module_folder_is_a_shipped_package() -> None:
    assert unshipped_module_folders(SRC) == []


def test_a_module_folder_without_init_is_reported(tmp_path: Path) -> None:
    # The defect the check names: a folder of modules without an ``__init__.py``.
    package = tmp_path / "pkg"
    (package / "formats").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "formats" / "skv.py").write_text("")
    assert unshipped_module_folders(tmp_path) == ["pkg.formats"]
    (package / "formats" / "__init__.py").write_text("")
    assert unshipped_module_folders(tmp_path) == []

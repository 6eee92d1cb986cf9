"""The documentation site's generated parts: report pages (``docs/hooks.py``) and docstring
markup (``docs/griffe_markup.py``). The strict build itself runs in ``scripts/test.sh``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import markdown
import pytest
from mkdocs.config import load_config
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.nav import Navigation, Section, get_navigation

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"seqkv_docs_{name}", ROOT / "docs" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


markup = _module("griffe_markup")


def _site(
    tmp_path: Path, reports: dict[str, str], nav_section: str = "Measurements"
) -> MkDocsConfig:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n")
    for name, text in reports.items():
        path = tmp_path / "reports" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    config_file = tmp_path / "mkdocs.yml"
    config_file.write_text(
        f"site_name: t\nhooks: [{ROOT / 'docs' / 'hooks.py'}]\n"
        f"nav:\n  - index.md\n  - {nav_section}:\n    - measurements/index.md\n"
    )
    return load_config(config_file=str(config_file))


def _files(config: MkDocsConfig, *uris: str) -> Files:
    return Files(
        [File(uri, config.docs_dir, config.site_dir, config.use_directory_urls) for uri in uris]
    )


def _on_files(config: MkDocsConfig, *uris: str) -> Files:
    # Through the plugin collection, as a build runs the hook (it records who generated a file).
    files: Files = config.plugins.on_files(_files(config, *uris), config=config)
    return files


def _on_nav(config: MkDocsConfig, files: Files) -> Navigation:
    nav: Navigation = config.plugins.on_nav(
        get_navigation(files, config), config=config, files=files
    )
    return nav


def _source(generated: str) -> str:
    """A generated page's text less its front matter and the hook's note: the report's text."""
    body = generated.split("---\n", 2)[2].removeprefix("\n")
    lines = body.split("\n")
    note = next(i for i, line in enumerate(lines) if line.startswith("*Generated from `"))
    # The note stands under the report's heading, set apart by a blank line on each side.
    if note == 0:
        return "\n".join(lines[2:])
    return "\n".join([*lines[: note - 2], lines[note - 2] + lines[note + 1], *lines[note + 2 :]])


def test_every_report_is_a_page_holding_its_text_unchanged() -> None:
    config = load_config(config_file=str(ROOT / "mkdocs.yml"))
    files = _on_files(config, "index.md")
    reports = sorted(p for p in (ROOT / "reports").rglob("*.md"))
    assert reports
    for report in reports:
        rel = report.relative_to(ROOT / "reports").as_posix()
        page = files.get_file_from_path(f"measurements/{rel}")
        assert page is not None, rel
        assert _source(page.content_string) == report.read_text(encoding="utf-8"), rel
    index = files.get_file_from_path("measurements/index.md")
    assert index is not None
    assert index.content_string.count("\n- [") == len(reports)


def test_a_report_copied_into_docs_is_refused(tmp_path: Path) -> None:
    config = _site(tmp_path, {"a.md": "# A\n"})
    assert _on_files(config, "index.md").get_file_from_path("measurements/a.md")
    with pytest.raises(PluginError, match="generated, not copied"):
        _on_files(config, "index.md", "measurements/a.md")


def test_a_missing_reports_folder_is_refused(tmp_path: Path) -> None:
    # Without the check the site would build with an empty Measurements section.
    config = _site(tmp_path, {})
    with pytest.raises(PluginError, match=r"no .*reports to generate"):
        _on_files(config, "index.md")


def test_titles_tell_reports_of_one_heading_apart(tmp_path: Path) -> None:
    config = _site(
        tmp_path,
        {
            "run_a.md": "# Run\n\nx\n",
            "run_b.md": "# Run\n\ny\n",
            "solo.md": "# Solo\n",
            "bare.md": "x\n",
        },
    )
    files = _on_files(config, "index.md")
    titles = {
        name: files.get_file_from_path(f"measurements/{name}.md").content_string.split("\n")[1]
        for name in ("run_a", "run_b", "solo", "bare")
    }
    assert titles == {
        "run_a": 'title: "Run (run_a)"',
        "run_b": 'title: "Run (run_b)"',
        "solo": 'title: "Solo"',
        "bare": 'title: "bare"',
    }


def test_the_nav_lists_every_report_page(tmp_path: Path) -> None:
    config = _site(tmp_path, {"b.md": "# B\n", "a.md": "# A\n", "sub/c.md": "# C\n"})
    files = _on_files(config, "index.md")
    nav = _on_nav(config, files)
    section = nav.items[1]
    assert isinstance(section, Section)
    assert [p.file.src_uri for p in section.children] == [
        "measurements/index.md",
        "measurements/a.md",
        "measurements/b.md",
        "measurements/sub/c.md",
    ]
    assert [p.file.src_uri for p in nav.pages][-1] == "measurements/sub/c.md"
    assert nav.pages[1].next_page is nav.pages[2]


def test_a_nav_without_the_measurements_section_is_refused(tmp_path: Path) -> None:
    config = _site(tmp_path, {"a.md": "# A\n"}, nav_section="Reports")
    files = _on_files(config, "index.md")
    with pytest.raises(PluginError, match="no 'Measurements' section"):
        _on_nav(config, files)


DOCSTRING = """Group sessions.

>>> [(1, 2) for _ in range(1)]
[(1, 2)]
>>> x = 1

After.

```python
>>> inside_a_fence
```

Indented as code::

    >>> already_code
    1
"""


def test_doctest_blocks_are_fenced_once() -> None:
    fenced = markup.fence_doctests(DOCSTRING)
    assert fenced.count("```pycon") == 1
    assert "```pycon\n>>> [(1, 2) for _ in range(1)]\n[(1, 2)]\n>>> x = 1\n```\n" in fenced
    assert markup.fence_doctests(fenced) == fenced


def test_an_unfenced_doctest_is_not_code_in_markdown() -> None:
    # The defect the fence repairs: the same block read as Markdown is a paragraph, whose output
    # line can parse as a reference link.
    block = ">>> [(1, 2)]\n[(1, 2)]\n"
    extensions = ["pymdownx.superfences"]
    assert "<code>" not in markdown.markdown(block, extensions=extensions)
    assert "<code>" in markdown.markdown(markup.fence_doctests(block), extensions=extensions)


def test_sphinx_roles_become_inline_code() -> None:
    text = "See :mod:`.settings`, :class:`~seqkv.delta.Predictor` and :py:func:`seqkv.compress`."
    assert markup.rst_to_markdown(text) == "See `.settings`, `Predictor` and `seqkv.compress`."
    # The defect: left as they are, the roles' markup shows on the page.
    assert ":mod:" in markdown.markdown(text)
    assert "<code>Predictor</code>" in markdown.markdown(markup.rst_to_markdown(text))


def test_a_literal_block_marker_keeps_one_colon() -> None:
    text = "Layout::\n\n    magic  4 bytes\n\n::\n\n    x\n\nRatio 1::2 stays."
    assert (
        markup.rst_to_markdown(text)
        == "Layout:\n\n    magic  4 bytes\n\n\n\n    x\n\nRatio 1::2 stays."
    )


def test_fenced_text_is_not_rewritten() -> None:
    text = "```text\n:mod:`x` ends::\n\n```\n"
    assert markup.rst_to_markdown(text) == text
    assert markup.rst_to_markdown(DOCSTRING) == markup.rst_to_markdown(
        markup.rst_to_markdown(DOCSTRING)
    )

"""MkDocs hook: the pages under "Measurements" are generated from ``reports/`` at build time.

The reports are written by repository commands (benchmarks, ``seqkv check``, ``seqkv bench``);
the site shows them as they are, so a figure on the site is the figure in its report.

Invariants:
1. Every file under ``reports/`` is published under ``measurements/`` at the same relative path
   (enforced: ``on_files``), so a report's relative links (to another report, to its figure)
   resolve on the site as they do in the repository, and ``mkdocs build --strict`` fails on one
   that does not.
2. No report is copied into ``docs/`` (enforced: pages are generated in memory; a file that
   already exists at a generated path is an error, not silently replaced).
3. The "Measurements" section of the nav lists every generated report page, in file-name order
   (enforced: ``on_nav``); its first page is the generated index.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.nav import Navigation, Section
from mkdocs.structure.pages import Page

REPORTS = "reports"
PREFIX = "measurements"
SECTION = "Measurements"
_H1 = re.compile(r"^# (.+)$", re.MULTILINE)


def _reports_dir(config: MkDocsConfig) -> Path:
    # mkdocs.yml sits at the repository root, beside reports/.
    return Path(config.config_file_path).resolve().parent / REPORTS


def _heading(text: str) -> str | None:
    match = _H1.search(text)
    return match.group(1).strip() if match else None


def _page(rel: str, text: str, title: str) -> str:
    """The report's text with a YAML title and, under its first heading, where it comes from."""
    note = f"*Generated from `{REPORTS}/{rel}` at build time: edit that file, not this page.*\n"
    match = _H1.search(text)
    if match is None:
        body = f"{note}\n{text}"
    else:
        end = match.end()
        body = f"{text[:end]}\n\n{note}{text[end:]}"
    escaped = title.replace("\\", "\\\\").replace('"', '\\"')
    return f'---\ntitle: "{escaped}"\n---\n\n{body}'


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = _reports_dir(config)
    if not root.is_dir():
        raise PluginError(f"docs/hooks.py: no {root} to generate the measurement pages from")
    sources = sorted(p for p in root.rglob("*") if p.is_file())
    texts = {p: p.read_text(encoding="utf-8") for p in sources if p.suffix == ".md"}
    # Reports that share a first heading (runs of one benchmark with other settings) are told
    # apart in the nav by their file name.
    headings = [_heading(t) for t in texts.values()]
    rows: list[tuple[str, str]] = []
    for path in sources:
        rel = path.relative_to(root).as_posix()
        uri = f"{PREFIX}/{rel}"
        if files.get_file_from_path(uri) is not None:
            raise PluginError(
                f"docs/hooks.py: docs/{uri} exists; reports are generated, not copied"
            )
        if path in texts:
            text = texts[path]
            heading = _heading(text)
            if heading is None:
                title = path.stem
            elif headings.count(heading) > 1:
                title = f"{heading} ({path.stem})"
            else:
                title = heading
            # Not in the nav as mkdocs reads it (so validation's omitted_files still catches a
            # hand-written page left out of mkdocs.yml); on_nav places these pages.
            page = _page(rel, text, title)
            files.append(
                File.generated(config, uri, content=page, inclusion=InclusionLevel.NOT_IN_NAV)
            )
            rows.append((rel, title))
        else:
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    index = [
        "# Measurements",
        "",
        f"Each page below is a report from the repository's `{REPORTS}/` folder, generated into",
        "this site at build time, so a figure here is the figure in its report.",
        "",
        *(f"- [{title}]({rel})" for rel, title in rows),
        "",
    ]
    files.append(File.generated(config, f"{PREFIX}/index.md", content="\n".join(index)))
    return files


def on_nav(nav: Navigation, config: MkDocsConfig, files: Files) -> Navigation:
    section = next((s for s in nav.items if isinstance(s, Section) and s.title == SECTION), None)
    if section is None:
        raise PluginError(f"docs/hooks.py: mkdocs.yml's nav has no {SECTION!r} section")
    pages = sorted(
        (
            f.page
            for f in files.documentation_pages()
            if f.src_uri.startswith(f"{PREFIX}/")
            and f.src_uri != f"{PREFIX}/index.md"
            and f.page is not None
        ),
        key=lambda p: p.file.src_uri,
    )
    for page in pages:
        page.parent = section
        section.children.append(page)
    # Previous/next links run through the whole nav, the generated pages included.
    ordered: list[Page] = []

    def walk(items: list[object]) -> None:
        for item in items:
            if isinstance(item, Page):
                ordered.append(item)
            elif isinstance(item, Section):
                walk(list(item.children))

    walk(list(nav.items))
    for before, after in itertools.pairwise(ordered):
        before.next_page, after.previous_page = after, before
    nav.pages = ordered
    return nav

"""What ``seqkv --help`` and every verb's ``--help`` print is plain text that matches the code
(issue 47, point 4): no reStructuredText markup (the module docstrings that feed some of it use
``double backticks`` and roles), the default level each ``--level`` states is the default its
parser applies (and the package's), and the format numbers ``upgrade`` states are the ones it
reads and writes.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from seqkv import cli
from seqkv.cli import sessions
from seqkv.formats.skv import read_skv
from seqkv.levels import DEFAULT_LEVEL
from seqkv.store.codecs import DEFAULT_STORE_LEVEL
from source_prose import cli_help_texts

LEGACY = Path(__file__).parent / "data" / "legacy"
MARKUP = re.compile(r"``|:(?:class|func|meth|mod|attr|data|obj|exc|ref|doc):`")
# "portable (default: ...", "(default portable)", "(default portable: ..."
STATED_DEFAULT = re.compile(r"([\w+:]+) \(default[:)]|\(default ([\w+:]+?)[:;,)]")


@pytest.fixture(scope="module")
def help_texts() -> dict[str, str]:
    return cli_help_texts()


def markup_in(texts: dict[str, str]) -> list[str]:
    return [f"{command}: ...{text[max(0, m.start() - 40):m.end() + 40]}..."
            for command, text in texts.items() for m in MARKUP.finditer(text)]


def test_every_verb_has_help(help_texts: dict[str, str]) -> None:
    assert {"seqkv", "seqkv compress", "seqkv decompress", "seqkv inspect", "seqkv upgrade",
            "seqkv check", "seqkv store put", "seqkv bench figures"} <= set(help_texts)


def test_help_is_plain_text(help_texts: dict[str, str]) -> None:
    found = markup_in(help_texts)
    assert not found, "reStructuredText markup in CLI help:\n" + "\n".join(found)


def test_markup_is_reported() -> None:
    """Feed the defect: the description the top-level help printed before is reported."""
    assert markup_in({"seqkv": "The ``seqkv`` command: compress, decompress"})
    assert markup_in({"seqkv x": "see :class:`seqkv.codec.CodedSession`"})
    assert not markup_in({"seqkv x": "--store dir:PATH (default dir:seqkv-store)"})


def _level_actions() -> list[tuple[str, argparse.Action]]:
    found = []

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{command} {name}")
            elif "--level" in action.option_strings:
                found.append((command, action))

    walk(cli.build_parser(), "seqkv")
    return found


def stated_default(help_text: str) -> str:
    """The one level a ``--level`` help names as its default."""
    named = {a or b for a, b in STATED_DEFAULT.findall(help_text)}
    assert len(named) == 1, f"the help names {sorted(named) or 'no'} default levels: {help_text}"
    return named.pop()


def _name(default: object) -> str:
    """A level default's name: argparse keeps a parsed ``CodingLevel`` or the name itself."""
    return default if isinstance(default, str) else str(default.spec.name)


def test_stated_default_level_is_the_parsers_and_the_packages() -> None:
    actions = _level_actions()
    assert {"seqkv compress", "seqkv check", "seqkv store put"} <= {c for c, _ in actions}
    for command, action in actions:
        assert action.help is not None, command
        stated = stated_default(action.help % vars(action))
        assert stated == _name(action.default), (command, stated, action.default)
        package = DEFAULT_STORE_LEVEL if command.startswith("seqkv store") else DEFAULT_LEVEL
        assert stated == package, (command, stated, package)


@pytest.mark.parametrize(("text", "level"), [
    ("rate-compute dial: portable (default: integer predictor), tokens", "portable"),
    ("the level a text is coded at (default portable); a .skv file", "portable"),
    ("coding level (default portable: decodes on any machine)", "portable"),
])
def test_stated_default_is_read(text: str, level: str) -> None:
    assert stated_default(text) == level


def test_a_stale_default_is_reported() -> None:
    """Feed the defect: a help that calls ``tokens`` the default names a level other than the
    code's, and one that names two defaults is refused."""
    assert stated_default("dial: tokens (default: the float model), portable") != DEFAULT_LEVEL
    with pytest.raises(AssertionError, match="default levels"):
        stated_default("tokens (default), portable (default: integer)")


def test_upgrade_help_names_the_formats_it_reads_and_writes(
        help_texts: dict[str, str]) -> None:
    """``upgrade``'s help says which formats it rewrites and into which; the CLI's own
    ``upgrade`` does exactly that to the committed legacy files, and leaves the file it writes
    unchanged."""
    stated = re.search(r"rewrite \.skv files of formats (\d+) and (\d+) in the framed format "
                       r"(\d+)", help_texts["seqkv"])
    assert stated, help_texts["seqkv"]
    sources, target = {int(stated[1]), int(stated[2])}, int(stated[3])
    for name in ("v1-tokens.skv", "v2-plain.skv"):
        data = (LEGACY / name).read_bytes()
        assert read_skv(data).version in sources
        rewritten = sessions.upgrade(data)
        assert read_skv(rewritten).version == target
        assert sessions.upgrade(rewritten) == rewritten

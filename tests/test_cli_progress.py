"""Progress: the library emits ``seqkv.progress`` events, the CLI renders them (bars on a
terminal, plain lines or JSON lines with ``--progress``), nothing scraped off the screen."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from seqkv import cli
from seqkv.cli import common
from seqkv.models import CausalLM
from seqkv.progress import Progress


def test_progress_events_render_as_lines_and_json_lines(use_tiny: CausalLM, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """The level emits events; the CLI renders them (no screen scraping): plain lines with
    --progress, one JSON object per line with --progress --json, the last event always."""
    source = tmp_path / "in.txt"
    source.write_text("a b c d e f g h i j k l")
    assert cli.main(["compress", str(source), "-o", str(tmp_path / "a.skv"), "--level",
                     "tokens", "--progress"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("seqkv: encoding 12/12 tok (100%)") for line in lines), lines
    assert cli.main(["compress", str(source), "-o", str(tmp_path / "b.skv"), "--level",
                     "tokens", "--progress", "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    done = [e for e in events if e["event"] == "progress" and e["task"] == "encoding"]
    assert done and (done[-1]["done"], done[-1]["total"], done[-1]["unit"]) == (12, 12, "tok")
    assert any(e["event"] == "phase" for e in events)


def test_the_reporter_throttles_lines_but_keeps_the_last(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    stream = io.StringIO()
    reporter = common.Reporter(common.ProgressMode.LINES, stream)
    for done in range(101):
        reporter(Progress("decoding", done, 100, "tok"))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("seqkv: decoding 100/100 tok (100%)")
    off = common.Reporter(common.ProgressMode.OFF, stream)
    assert off.sink is None and reporter.sink is reporter


def test_the_command_process_freezes_its_loaded_model_out_of_the_collector(
        use_tiny: CausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``seqkv`` itself (main() reading sys.argv) freezes what the load left; a caller of
    main([...]) keeps its collector untouched."""
    import gc
    import sys

    source = tmp_path / "in.txt"
    source.write_text("a b c d e f")
    assert gc.get_freeze_count() == 0
    assert cli.main(["compress", str(source), "-o", str(tmp_path / "a.skv"), "--level",
                     "ngram"]) == 0
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(sys, "argv", ["seqkv", "compress", str(source), "-o",
                                      str(tmp_path / "b.skv"), "--level", "ngram"])
    try:
        assert cli.main() == 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    capsys.readouterr()

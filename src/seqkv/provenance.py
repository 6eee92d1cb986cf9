"""What every report in ``reports/`` states about its run: command, commit, machine, CPU path,
load, torch, model and data, so that a figure is read with the run that measured it.

One function, ``start_run``, gathers the facts when a measurement starts; ``RunHeader.finished``
adds the load average at its end; ``RunHeader.markdown`` renders the lines a report opens with.
The checker's report writer (``seqkv check``), the benchmarks under ``benchmarks/`` and the lab's
generators under ``research/`` all call it, so the product does not depend on the benchmarks.

Invariants:
1. Gathering the facts never fails and never waits unboundedly: outside a git checkout, without
   git, or when git does not answer within ``GIT_TIMEOUT_S``, the commit reads ``unknown``; where
   the platform has no load average it reads ``None`` and renders as ``unavailable``; where the
   integer forward's path cannot be chosen (a bad ``$SEQKV_INTEGER_*``, a forced path that does
   not build), the CPU path names the reason; the path's first build is bounded by
   ``seqkv.models.integer.native``'s own timeouts (enforced; tested in
   ``tests/test_provenance.py``).
2. The commit is ``git rev-parse --short HEAD`` of the checkout that holds the imported seqkv,
   with ``+dirty`` when a tracked file differs from it (untracked files, such as build outputs and
   the report being written, do not count) (enforced).
3. Nothing here changes a figure: the facts are read, never set (no thread count, no variable).
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from seqkv.errors import SeqKVError
from seqkv.models.integer import native
from seqkv.schedule import cpu_model

# NOTE: ``git rev-parse`` and ``git status`` answer in milliseconds on a healthy checkout; the
# bound only keeps a hung git (a network filesystem, a lock) from holding a report open.
GIT_TIMEOUT_S = 10.0
UNKNOWN = "unknown"

LoadAverage = tuple[float, float, float]


@dataclass(frozen=True)
class RunHeader:
    """The facts a report states about its run (``start_run`` gathers them)."""

    command: str
    commit: str  # short hash, ``+dirty`` when tracked files differ; ``unknown`` outside git
    machine: str  # cores, architecture, CPU name and id, torch's vector capability
    cpu_path: str  # the instruction set the integer forward (``portable`` levels) runs on
    torch_version: str
    model: str
    data: str
    load_start: LoadAverage | None  # None: the platform has no load average
    load_end: LoadAverage | None = None
    ended: bool = False  # whether ``load_end`` was read (``finished``)

    def finished(self) -> RunHeader:
        """This header with the load average at the end of the run."""
        return replace(self, load_end=load_average(), ended=True)

    def to_json_dict(self) -> dict[str, object]:
        """The header as JSON values (``from_json_dict`` reads them back), for a measurement
        that saves its results and is rendered later."""
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> RunHeader:
        """The header ``to_json_dict`` wrote (load averages come back as tuples)."""

        def loads(value: Any) -> LoadAverage | None:
            return None if value is None else (float(value[0]), float(value[1]),
                                               float(value[2]))

        return cls(**{**data, "load_start": loads(data["load_start"]),
                      "load_end": loads(data.get("load_end"))})

    def load(self) -> str:
        """The load averages at the start and, once finished, at the end."""
        text = f"{_render_load(self.load_start)} at the start"
        if self.ended:
            text += f", {_render_load(self.load_end)} at the end"
        return text

    def markdown(self) -> str:
        """The header as a markdown list, one fact per line (no trailing blank line)."""
        return "\n".join([
            f"- command: `{self.command}`",
            f"- commit: {self.commit}",
            f"- machine: {self.machine}; torch {self.torch_version}",
            f"- CPU path: {self.cpu_path}",
            f"- load average (1, 5, 15 min): {self.load()}",
            f"- model: {self.model}",
            f"- data: {self.data}",
        ])


def _render_load(load: LoadAverage | None) -> str:
    return "unavailable" if load is None else " ".join(f"{x:.2f}" for x in load)


def load_average() -> LoadAverage | None:
    """The 1, 5 and 15-minute load averages, or None where the platform has none."""
    try:
        return os.getloadavg()
    except OSError:
        return None


def _git(root: Path, *words: str) -> str | None:
    """git's stripped output in ``root``, or None when git is missing, fails or hangs."""
    try:
        done = subprocess.run(["git", "-C", str(root), *words], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit(root: Path | None = None) -> str:
    """The short commit of the checkout holding ``root`` (default: the imported seqkv's
    folder), ``+dirty`` when a tracked file differs from it (``+unknown-status`` when git
    cannot say); ``unknown`` outside a checkout or without git."""
    root = Path(__file__).resolve().parent if root is None else root
    head = _git(root, "rev-parse", "--short", "HEAD")
    if not head:
        return UNKNOWN
    changes = _git(root, "status", "--porcelain", "--untracked-files=no")
    if changes is None:  # the status could not be read: never claim a clean tree
        return head + "+unknown-status"
    return head + ("+dirty" if changes else "")


def _cpu_name() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine() or UNKNOWN
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    return name.group(1).strip() if name else (platform.processor() or UNKNOWN)


def machine() -> str:
    """CPU cores, architecture, CPU name and vendor-family-model id, torch's capability."""
    return (f"{os.cpu_count()} CPU cores ({platform.machine() or UNKNOWN}, {_cpu_name()}, "
            f"{cpu_model()}, {torch.backends.cpu.get_cpu_capability()})")


def cpu_path() -> str:
    """The instruction set of the integer forward here, as ``seqkv doctor`` reports it."""
    try:
        status = native.status()
    # NOTE: ``native.load`` raises RuntimeError where a forced path does not build, and
    # ``IntegerBackendError`` for a bad variable; the header names either, and goes on.
    except (SeqKVError, RuntimeError) as error:
        return f"{UNKNOWN} ({error})"
    isa = "the torch statement" if status.isa is None else status.isa
    return f"integer forward on {isa} ({status.reason})"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as a reader retypes it: ``python`` for the interpreter, ``seqkv`` for the
    console script, paths inside the working folder made relative (default: ``sys.orig_argv``)."""
    words = list(sys.orig_argv if argv is None else argv)
    if not words:
        return UNKNOWN
    rest = words[1:]
    if rest and Path(rest[0]).name == "seqkv" and not rest[0].endswith(".py"):
        head, rest = ["seqkv"], rest[1:]
    else:
        head = ["python"]
    cwd = Path.cwd()

    def relative(word: str) -> str:
        path = Path(word)
        if path.is_absolute() and path.is_relative_to(cwd):
            return str(path.relative_to(cwd))
        return word

    return shlex.join(head + [relative(word) for word in rest])


def start_run(model: str, data: str, command: str | None = None,
              root: Path | None = None) -> RunHeader:
    """The header of a run that starts now, on ``model`` and ``data`` (free text as the report
    states them); ``command`` defaults to this process's command line (``command_line``)."""
    return RunHeader(
        command=command_line() if command is None else command,
        commit=commit(root),
        machine=machine(),
        cpu_path=cpu_path(),
        torch_version=torch.__version__,
        model=model,
        data=data,
        load_start=load_average(),
    )


def headed(markdown: str, header: RunHeader) -> str:
    """``markdown`` with ``header`` right under its ``# `` title line (at the top where it has
    none), so the first lines of every report carry its provenance."""
    title, _, body = markdown.partition("\n")
    if not title.startswith("# "):
        return f"{header.markdown()}\n\n{markdown}"
    return f"{title}\n\n{header.markdown()}\n\n{body.lstrip(chr(10))}"

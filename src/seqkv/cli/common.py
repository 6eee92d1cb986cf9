"""What every ``seqkv`` verb shares: the parser, argument checks, loading the model, reading
inputs, writing outputs, progress, printing figures, and the options that recur.

Invariants:
1. Every argument is checked when it is parsed (types, ranges, paths), and every cross-argument
   rule (an output is never an input, two outputs never coincide) right after, before any verb
   starts work; a failure is one line ``seqkv: error: ...`` on stderr and exit status 2
   (enforced: ``Parser.error``; ``tests/test_cli_misuse.py``).
2. Outputs are written only through ``write_outputs`` (atomic, all staged before any is renamed:
   ``seqkv.files``), so a handled failure changes no output (enforced).
3. Progress goes to stderr only, never to stdout, whose content is the command's result
   (enforced).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import io
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn, TextIO, TypeAlias

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from seqkv.coding.residual_code import MAX_TOLERANCE, MIN_TOLERANCE, is_tolerance
from seqkv.errors import EmptyInputError, InputTooLongError, OutputError, UsageError
from seqkv.files import write_all_atomically
from seqkv.levels import CodingLevel, parse_level
from seqkv.limits import MAX_NAME_BYTES, MAX_POSITIONS, MAX_TEXT_BYTES_PER_POSITION
from seqkv.models import CausalLM, load_default_model, load_model
from seqkv.progress import Progress, ProgressSink

MODEL_HELP = "local HF model folder or .gguf file (default: embedded SmolLM2-135M-Instruct)"
STDIO = "-"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``seqkv: error: ...``, exit status 2.

    argparse's own errors print the usage (five lines and more) first; sub-parsers made by
    ``add_subparsers`` are of this class too.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"seqkv: error: {message} ({self.prog} --help)\n")


Subparsers: TypeAlias = "argparse._SubParsersAction[Parser]"


def load(model_path: str | None) -> CausalLM:
    """The model a verb runs on: ``--model PATH`` or the embedded default."""
    return load_default_model() if model_path is None else load_model(model_path)


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence what loading a model prints: the GGUF converter's tqdm bars and the libraries'
    warnings and log lines (stderr, Python warnings, transformers' logger)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        with warnings.catch_warnings(), redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)


def load_for(args: argparse.Namespace) -> CausalLM:
    """``load`` for a verb: quiet unless ``--progress`` was given, so that a failure prints only
    its one ``seqkv: error:`` line. In the command's own process, what the load left (the model,
    its tokenizer: about 400,000 objects) is then frozen out of the garbage collector's
    passes."""
    if getattr(args, "progress", False):
        model = load(args.model)
    else:
        with _quiet():
            model = load(args.model)
    # NOTE: a verb keeps its model to the end, and each full collection would walk all of it,
    # a visible share of a long context's integer steps (reports/code_notes.md).
    # The frozen objects are never collected, not even at exit: triton's bindings (imported by
    # torch) then report their objects in frozen cycles as ~27 lines of "nanobind: leaked ..."
    # on stderr after every verb. Unfrozen at exit, before the interpreter's last collection.
    if getattr(args, "freeze_after_load", False):
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)
    return model



def tolerance(text: str) -> float:
    """A residual tolerance: 0, or a normal number up to MAX_TOLERANCE (``is_tolerance``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not is_tolerance(value):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the tolerance is 0 (bit-exact) or a normal number from "
            f"{MIN_TOLERANCE:g} to {MAX_TOLERANCE:g}")
    return value


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An integer type with the range ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside [{low:,}, {high:,}]")
        return value

    parse.__name__ = "integer"
    return parse


def level_argument(text: str) -> CodingLevel:
    try:
        return parse_level(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def level_name(text: str) -> str:
    """A level's name, checked like ``level_argument``."""
    return level_argument(text).spec.name


def input_file(text: str) -> str:
    """An existing, readable regular file (or ``-`` for stdin)."""
    if text == STDIO:
        return text
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} cannot be read (permission denied)")
    return text


def input_file_no_stdin(text: str) -> str:
    if text == STDIO:
        raise argparse.ArgumentTypeError("this input must be a file, not - (stdin)")
    return input_file(text)


def model_path(text: str) -> str:
    """An existing model folder or file (its content is checked when it loads)."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"no such model file or folder: {text}")
    return text


def _check_output(text: str, create_parents: bool) -> None:
    """Raise ArgumentTypeError unless a file can be written at ``text``."""
    if not text or text.endswith(os.sep):
        raise argparse.ArgumentTypeError(f"{text!r} names a folder, not a file")
    path = Path(text)
    if len(os.fsencode(path.name)) > MAX_NAME_BYTES:
        raise argparse.ArgumentTypeError(
            f"the file name of {text} is longer than {MAX_NAME_BYTES} bytes")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory: name a file")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a regular file")
    _check_folder(path.parent, create_parents, text)


def _check_folder(folder: Path, create: bool, text: str) -> None:
    """Raise ArgumentTypeError unless files can be created in ``folder`` (or, with ``create``,
    in the folder ``mkdir -p`` would make)."""
    probe = folder
    while create and not probe.exists() and probe != probe.parent:
        if any(len(os.fsencode(part)) > MAX_NAME_BYTES for part in probe.parts):
            raise argparse.ArgumentTypeError(f"a folder name in {text} is too long")
        probe = probe.parent
    if not probe.exists():
        raise argparse.ArgumentTypeError(f"the folder {folder} of {text} does not exist")
    if not probe.is_dir():
        raise argparse.ArgumentTypeError(f"{probe} in {text} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"the folder {probe} is not writable")


def output_file(text: str) -> str:
    """A file that can be written: its folder exists and is writable, no directory is in the
    way, its name fits the file system."""
    if text == STDIO:
        raise argparse.ArgumentTypeError("this output must be a file, not - (stdout)")
    _check_output(text, create_parents=False)
    return text


def output_file_or_stdout(text: str) -> str:
    if text != STDIO:
        _check_output(text, create_parents=False)
    return text


def output_file_in_new_folder(text: str) -> str:
    """As ``output_file``, but missing folders are created (reports)."""
    if text == STDIO:
        raise argparse.ArgumentTypeError("this output must be a file, not - (stdout)")
    _check_output(text, create_parents=True)
    return text


def output_folder(text: str) -> str:
    """A folder that exists or can be created, and where files can be written."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a folder")
    _check_folder(path, create=True, text=text)
    return text



def model_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--model", metavar="PATH", type=model_path, default=None,
                         help=MODEL_HELP)


def json_option(command: argparse.ArgumentParser, what: str = "one JSON object") -> None:
    command.add_argument("--json", action="store_true", help=f"print {what}")


def progress_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--progress", action="store_true",
                         help="report progress on stderr even when it is not a terminal: plain "
                              "lines, or JSON lines with --json")


def decode_limit_options(command: argparse.ArgumentParser) -> None:
    """``--max-tokens`` and ``--max-memory-mb``: the caller's limits on a decode
    (``seqkv.codec.DecodeLimits``), checked before any forward."""
    command.add_argument("--max-tokens", type=int_in(1, MAX_POSITIONS), default=None,
                         metavar="N", help="refuse a file of more than N tokens before decoding "
                                           "(default: the model's context; without a model, "
                                           "131,072)")
    command.add_argument("--max-memory-mb", type=int_in(1, 1 << 30), default=None,
                         metavar="MB", help="refuse a file whose decode would hold more than MB "
                                            "MiB beyond the model (docs/guides/limits.md: "
                                            "Bounded decoding)")


def memory_limit(args: argparse.Namespace) -> int | None:
    """``--max-memory-mb`` in bytes, or None."""
    megabytes: int | None = args.max_memory_mb
    return None if megabytes is None else megabytes << 20


def tolerance_option(command: argparse.ArgumentParser, default: float) -> None:
    command.add_argument("--tolerance", type=tolerance, default=default,
                         help=f"max abs KV error (default {default}; 0 = bit-exact)")


@dataclass(frozen=True)
class PathRoles:
    """Which attributes of a verb's arguments name input files and which output files, so that
    ``check_paths`` can refuse an output that is an input, or two outputs that coincide."""

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


def _names(args: argparse.Namespace, attributes: Sequence[str]) -> list[str]:
    names: list[str] = []
    for attribute in attributes:
        value = getattr(args, attribute, None)
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, list):
            names.extend(v for v in value if isinstance(v, str))
    return [name for name in names if name != STDIO]


def _same_file(a: str, b: str) -> bool:
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        return False
    return os.path.realpath(a) == os.path.realpath(b)


def check_paths(args: argparse.Namespace) -> None:
    """UsageError when an output is one of the inputs or two outputs name one file."""
    roles: PathRoles = getattr(args, "paths", PathRoles())
    inputs, outputs = _names(args, roles.inputs), _names(args, roles.outputs)
    for output in outputs:
        for name in inputs:
            if _same_file(output, name):
                raise UsageError(f"the output {output} is the input {name}: writing it would "
                                 "destroy the input; name another output file")
    for index, output in enumerate(outputs):
        for other in outputs[index + 1 :]:
            if _same_file(output, other):
                raise UsageError(f"two outputs name the same file {output}: name two files")



def text_limit(model: CausalLM) -> int | None:
    """The most bytes of text worth tokenizing for ``model`` (see MAX_TEXT_BYTES_PER_POSITION)."""
    context = getattr(model.config, "max_position_embeddings", None)
    return MAX_TEXT_BYTES_PER_POSITION * context if isinstance(context, int) else None


def read_text(path: str, limit: int | None = None) -> str:
    """The UTF-8 text of ``path`` (``-``: stdin), refused above ``limit`` bytes before it is
    read whole."""
    if path == STDIO:
        raw = sys.stdin.buffer.read(-1 if limit is None else limit + 1)
    else:
        with open(path, "rb") as stream:
            raw = stream.read(-1 if limit is None else limit + 1)
    if limit is not None and len(raw) > limit:
        raise InputTooLongError(
            f"{'stdin' if path == STDIO else path} holds more than {limit:,} bytes, more text "
            "than the model's context can hold: split it into sessions that fit")
    text = raw.decode("utf-8")
    if not text:
        raise EmptyInputError(f"{path} is empty: there is nothing to compress")
    return text


def read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def write_outputs(outputs: Sequence[tuple[str, bytes]]) -> None:
    """Write every ``(path, data)`` atomically: files are all staged before any replaces its
    target; ``-`` goes to stdout after the files. Any OSError becomes one OutputError."""
    files = [(path, data) for path, data in outputs if path != STDIO]
    try:
        write_all_atomically(files)
    except OSError as error:
        where = error.filename or (files[0][0] if files else "the output")
        raise OutputError(f"cannot write {where}: {error.strerror or error}; no output was "
                          "changed") from None
    for path, data in outputs:
        if path == STDIO:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()


def write_text(path: str, text: str) -> None:
    write_outputs([(path, text.encode("utf-8"))])


def make_folder(path: str | Path) -> None:
    """``mkdir -p``, with an OSError as one OutputError."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot create the folder {path}: {error.strerror or error}") from None


def print_figures(figures: dict[str, object], as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(figures, default=str))
        return
    table = Table(title=title, show_header=False)
    for key, value in figures.items():
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    Console().print(table)



class ProgressMode(Enum):
    OFF = "off"  # stderr is not a terminal and --progress was not given
    TERMINAL = "terminal"  # bars on a terminal
    LINES = "lines"  # --progress: one plain line per update
    JSON = "json"  # --progress --json: one JSON object per line


# NOTE: one line per second per task keeps a log readable (a decode emits an event per token).
_PROGRESS_INTERVAL_SECONDS = 1.0


@dataclass
class Reporter:
    """Renders the commands' phases and the library's ``Progress`` events on stderr, in the
    chosen mode: tqdm bars on a terminal, plain lines or JSON lines otherwise."""

    mode: ProgressMode
    stream: TextIO
    started: float = field(default_factory=time.perf_counter)
    _last: dict[str, tuple[float, int]] = field(default_factory=dict)
    _bars: dict[str, Any] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.mode is not ProgressMode.OFF

    @property
    def sink(self) -> ProgressSink | None:
        """What to hand the library: this reporter, or None when nothing is shown."""
        return self if self.enabled else None

    def _elapsed(self) -> float:
        return round(time.perf_counter() - self.started, 3)

    def _emit(self, event: dict[str, Any], line: str) -> None:
        if self.mode is ProgressMode.JSON:
            self.stream.write(json.dumps(event) + "\n")
        else:
            self.stream.write(f"seqkv: {line}\n")
        self.stream.flush()

    def phase(self, name: str) -> None:
        """A step of the command begins (shown in the LINES and JSON modes)."""
        if self.mode in (ProgressMode.LINES, ProgressMode.JSON):
            self._emit({"event": "phase", "phase": name, "elapsed_s": self._elapsed()},
                       f"{name} ({self._elapsed():.1f} s)")

    def __call__(self, event: Progress) -> None:
        """One ``Progress`` event: a bar on a terminal, else a line at most once a second per
        task (and always the last one)."""
        finished = event.total is not None and event.done >= event.total
        if self.mode is ProgressMode.TERMINAL:
            bar = self._bars.get(event.task)
            if bar is None:
                bar = self._bars[event.task] = tqdm(total=event.total, desc=event.task,
                                                    unit=event.unit, file=self.stream)
            bar.update(event.done - bar.n)
            if finished:
                bar.close()
                del self._bars[event.task]
            return
        if self.mode is ProgressMode.OFF:
            return
        now = time.perf_counter()
        last_time, last_done = self._last.get(event.task, (-math.inf, -1))
        if event.done == last_done or (now - last_time < _PROGRESS_INTERVAL_SECONDS
                                       and not finished):
            return
        self._last[event.task] = (now, event.done)
        total = event.total
        share = f" ({100 * event.done / total:.0f}%)" if total else ""
        self._emit({"event": "progress", "task": event.task, "done": event.done,
                    "total": total, "unit": event.unit, "elapsed_s": self._elapsed()},
                   f"{event.task} {event.done:,}/{'?' if total is None else f'{total:,}'} "
                   f"{event.unit}{share}, {self._elapsed():.1f} s")

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()


def progress_mode(args: argparse.Namespace, stream: TextIO) -> ProgressMode:
    if getattr(args, "progress", False):
        return ProgressMode.JSON if getattr(args, "json", False) else ProgressMode.LINES
    isatty = getattr(stream, "isatty", None)
    return ProgressMode.TERMINAL if isatty is not None and isatty() else ProgressMode.OFF


@contextmanager
def reporting(args: argparse.Namespace) -> Iterator[Reporter]:
    """The command's reporter, its bars closed on exit."""
    reporter = Reporter(progress_mode(args, sys.stderr), sys.stderr)
    try:
        yield reporter
    finally:
        reporter.close()


def reporter_of(args: argparse.Namespace) -> Reporter:
    """The reporter ``main`` attached to ``args`` (an OFF one when a verb runs alone)."""
    reporter = getattr(args, "reporter", None)
    return reporter if isinstance(reporter, Reporter) else Reporter(ProgressMode.OFF, sys.stderr)

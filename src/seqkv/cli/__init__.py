"""The seqkv command: compress, decompress, inspect, upgrade, check, store, bench, demo, doctor.

Every ``SeqKVError`` (bad input, damaged file, wrong model), every bad argument and every error
of the operating system on an input or output ends the command with one line on stderr and exit
status 2, never a traceback. ``check`` exits 1 when a bound is violated. Arguments are checked
when they are parsed, before any work starts; output files are written atomically, all staged
before any replaces its target, and ``compress`` writes its file only after a full decode has
verified it (unless ``--no-verify``). ``--progress`` reports progress on stderr even when it is
not a terminal (JSON lines with ``--json``).

One module per group of verbs; each adds its parsers through a function listed in
``VERB_GROUPS``, and may declare which arguments are input and output paths
(``set_defaults(paths=common.PathRoles(...))``) so that an output is never an input, and a
``complete(args)`` that fills and checks defaults computed from other arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from seqkv.cli import bench, check, common, doctor, sessions, store
from seqkv.cli import dict as dictionaries
from seqkv.errors import SeqKVError

VERB_GROUPS: tuple[Callable[[common.Subparsers], None], ...] = (
    sessions.add_session_verbs,
    dictionaries.add_dict,
    check.add_check,
    store.add_store,
    bench.add_bench,
    sessions.add_demo,
    doctor.add_doctor,
)


def build_parser(groups: Sequence[Callable[[common.Subparsers], None]] = VERB_GROUPS,
                 prog: str = "seqkv", description: str = __doc__.splitlines()[0]
                 ) -> common.Parser:
    parser = common.Parser(prog=prog, description=description)
    commands = parser.add_subparsers(dest="command", required=True)
    for add in groups:
        add(commands)
    return parser


def _message(error: BaseException) -> str:
    if isinstance(error, FileNotFoundError):
        return f"no such file: {error.filename}"
    if isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror or error}"
    if isinstance(error, UnicodeDecodeError):
        return f"the input is not UTF-8 text: {error}"
    if isinstance(error, MemoryError):
        return "out of memory"
    return str(error)


def main(argv: Sequence[str] | None = None,
         groups: Sequence[Callable[[common.Subparsers], None]] = VERB_GROUPS,
         prog: str = "seqkv", description: str = __doc__.splitlines()[0]) -> int:
    """Run one command; ``groups``, ``prog`` and ``description`` let a tool outside the package
    (``python -m research.bench``) run its own verbs with the same parsing and error handling."""
    parser = build_parser(groups, prog, description)
    try:
        args = parser.parse_args(argv)
        # the command's own process (``seqkv``, ``python -m seqkv``) freezes its loaded model out
        # of the collector; a caller of main([...]) (a test, a script) keeps its collector as is
        args.freeze_after_load = argv is None
    except SystemExit as done:  # --help (0), or a usage error already printed as one line (2)
        return done.code if isinstance(done.code, int) else 0 if done.code is None else 2
    complete = getattr(args, "complete", None)
    try:
        if complete is not None:
            complete(args)
        common.check_paths(args)
    except (SeqKVError, argparse.ArgumentTypeError) as error:
        print(f"seqkv: error: {error}", file=sys.stderr)
        return 2
    failure: BaseException | None = None
    status = 2
    with common.reporting(args) as reporter:
        args.reporter = reporter
        try:
            status = args.run(args)
        except (SeqKVError, OSError, UnicodeDecodeError, MemoryError) as error:
            failure = error
        except KeyboardInterrupt:
            print("seqkv: interrupted", file=sys.stderr)
            return 130
    if failure is not None:
        print(f"seqkv: error: {_message(failure)}", file=sys.stderr)
        return 2
    return status

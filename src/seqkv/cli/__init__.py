"""The ``seqkv`` command: compress, decompress, inspect, upgrade, check, store, bench, demo.

Every ``SeqKVError`` (bad input, damaged file, wrong model) ends the command with one line on
stderr and exit status 2, never a traceback. ``check`` exits 1 when a bound is violated. Output
files are written atomically, and ``compress`` writes its file only after a full decode has
verified it (unless ``--no-verify``). One module per group of verbs; each adds its parsers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from seqkv.cli import bench, check, sessions, store
from seqkv.errors import SeqKVError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqkv", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sessions.add_session_verbs(commands)
    check.add_check(commands)
    store.add_store(commands)
    bench.add_bench(commands)
    sessions.add_demo(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except SeqKVError as error:
        print(f"seqkv: error: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"seqkv: error: no such file: {error.filename}", file=sys.stderr)
        return 2
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        print(f"seqkv: error: {error}", file=sys.stderr)
        return 2
    return status

"""Writing files so that an existing file is replaced whole or not at all.

Every output seqkv writes (``.skv`` files, texts, KV safetensors, reports, trie snapshots,
description entries) goes through here.

Invariants:
1. A target is only ever changed by one ``os.replace`` of a complete, fsynced temporary file
   beside it: after a crash or ``kill -9`` at any instant the target is wholly old or wholly new
   (enforced). A kill between staging and renaming can leave a hidden ``.NAME.HEX.tmp`` beside
   the target, never a damaged target.
2. On any exception (a full disk, a read-only folder, an interrupt) every temporary this call
   created is removed and no target has changed, as long as the failure comes before the first
   rename (enforced: ``write_all_atomically`` stages every output before renaming any).
3. Temporary names are unique (8 random bytes), so concurrent writers never share one
   (enforced: ``O_EXCL``).
4. New files get the usual permissions (0o666 less the umask), unlike ``tempfile.mkstemp``'s
   0o600 (enforced).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from seqkv.limits import MAX_NAME_BYTES


def temporary_name(target: Path) -> Path:
    """A fresh hidden name beside ``target`` (shortened when the target's name is long)."""
    token = secrets.token_hex(8)
    name = f".{target.name}.{token}.tmp"
    if len(os.fsencode(name)) > MAX_NAME_BYTES:
        name = f".seqkv.{token}.tmp"
    return target.with_name(name)


def _stage(target: Path, data: bytes) -> Path:
    """``data`` in a new fsynced temporary beside ``target``; nothing left behind on failure."""
    temporary = temporary_name(target)
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


def _commit(temporary: Path, target: Path) -> None:
    """Rename ``temporary`` over ``target``, then make the rename durable (best effort: some
    file systems cannot fsync a folder)."""
    os.replace(temporary, target)
    try:
        folder = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(folder)
    except OSError:
        pass
    finally:
        os.close(folder)


def write_all_atomically(outputs: Sequence[tuple[str | os.PathLike[str], bytes]]) -> None:
    """Write every ``(path, data)``: stage all of them as fsynced temporaries, then rename each
    over its target. A failure while staging changes no target (see the module invariants)."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in outputs:
            target = Path(path)
            staged.append((_stage(target, data), target))
        for temporary, target in staged:
            _commit(temporary, target)
    except BaseException:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it over ``path``.

    A crash or error at any point leaves the old file (if any) untouched and no temporary behind.
    """
    write_all_atomically([(path, data)])


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that wants a path rather than bytes; once
    the block ends without an exception the file is fsynced and renamed over ``path``, else it
    is removed."""
    target = Path(path)
    temporary = temporary_name(target)
    try:
        yield temporary
        handle = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
        _commit(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise

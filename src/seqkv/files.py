"""Writing files so that an existing file is replaced whole or not at all."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it over ``path``.

    A crash or error at any point leaves the old file (if any) untouched and no temporary behind.
    The new file gets the usual permissions (0o666 less the umask), unlike ``tempfile.mkstemp``'s
    0o600.
    """
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise

"""Where the full descriptions behind a compact file's digests live: a folder of small JSON files.

A format-3 ``.skv`` file names its model and execution profile by 8-byte digests
(``seqkv.digests``). The descriptions themselves (model name and hashes; schedule, dtype, device,
CPU, thread count, library versions) are kept once per machine in this registry, written by
``seqkv compress`` and ``seqkv upgrade``, so that ``seqkv inspect`` can print them and a decoder
can say which fields differ when it refuses a file. Without the description a decoder still
refuses a mismatch, naming the digests. A store keeps its own copy per store.

The registry's folder is ``$SEQKV_HOME/descriptions`` (default ``~/.cache/seqkv/descriptions``):
``models/<digest>.json`` and ``profiles/<digest>.json``.

Invariants:
1. An entry is written atomically and never changes: its name is the digest of its content
   (enforced: ``remember`` checks the digest of what it writes, ``lookup`` of what it reads and
   ignores an entry whose content does not match its name).
2. Reading never raises on a damaged or hostile entry: it is treated as absent (enforced).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from seqkv.digests import Digest, model_digest, profile_digest
from seqkv.files import write_atomically
from seqkv.types import ExecutionProfile, ModelIdentity

_ENTRY_LIMIT_BYTES = 64 * 1024


def default_root() -> Path:
    home = os.environ.get("SEQKV_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "seqkv"
    return base / "descriptions"


class Descriptions:
    """The registry in one folder (see the module docstring)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else default_root()

    def remember(self, model: ModelIdentity | None = None,
                 profile: ExecutionProfile | None = None) -> None:
        """Store descriptions (an entry already present is left as it is)."""
        if model is not None:
            self._write("models", model_digest(model), asdict(model))
        if profile is not None:
            self._write("profiles", profile_digest(profile), asdict(profile))

    def model(self, digest: Digest) -> ModelIdentity | None:
        raw = self._read("models", digest)
        try:
            identity = ModelIdentity(**raw) if raw is not None else None
        except TypeError:
            return None
        return identity if identity is not None and model_digest(identity) == digest else None

    def profile(self, digest: Digest) -> ExecutionProfile | None:
        raw = self._read("profiles", digest)
        try:
            profile = ExecutionProfile(**raw) if raw is not None else None
        except TypeError:
            return None
        return profile if profile is not None and profile_digest(profile) == digest else None

    def _path(self, kind: str, digest: Digest) -> Path:
        return self.root / kind / f"{digest.hex()}.json"

    def _write(self, kind: str, digest: Digest, content: dict[str, Any]) -> None:
        path = self._path(kind, digest)
        if path.is_file():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(content, sort_keys=True).encode())

    def _read(self, kind: str, digest: Digest) -> dict[str, Any] | None:
        path = self._path(kind, digest)
        try:
            if path.stat().st_size > _ENTRY_LIMIT_BYTES:
                return None
            raw = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
            return None
        return raw

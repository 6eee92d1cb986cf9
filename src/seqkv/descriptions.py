"""Where the full descriptions behind a compact file's digests live: a folder of small JSON files.

A format-3 or 4 ``.skv`` file names its model and execution profile by 8-byte digests
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
2. Reading never raises on a damaged or hostile entry: it is treated as absent (enforced). An
   entry is read only if it is at most 64 KiB of flat JSON (no nesting, no NaN, no repeated
   keys) whose fields are exactly the description's, each of its declared type (enforced:
   ``_fields``; ``tests/test_descriptions.py``).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any, Protocol, get_args

from seqkv import environment
from seqkv.digests import Digest, model_digest, profile_digest
from seqkv.errors import SeqKVError
from seqkv.files import write_atomically
from seqkv.formats.framing import load_json
from seqkv.limits import MAX_DESCRIPTION_BYTES
from seqkv.types import ExecutionProfile, ModelIdentity, Schedule

# What each annotation of ``ModelIdentity`` and ``ExecutionProfile`` admits from JSON.
_SCHEDULES = get_args(Schedule)


class _Unreadable(SeqKVError):
    """An entry that is not flat JSON within the size limit (treated as absent)."""


def _admits(annotation: str, value: Any) -> bool:
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "str | None":
        return value is None or isinstance(value, str)
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if annotation == "Schedule":
        return value in _SCHEDULES
    return False


def _fields(raw: dict[str, Any], kind: type[ModelIdentity] | type[ExecutionProfile]
            ) -> dict[str, Any] | None:
    """``raw`` if its keys are exactly ``kind``'s fields (those with defaults may be absent),
    each of its declared type; else None."""
    known = {field.name: field for field in fields(kind)}
    required = {name for name, field in known.items()
                if field.default is MISSING and field.default_factory is MISSING}
    if not required <= set(raw) <= set(known):
        return None
    if not all(_admits(str(known[name].type), value) for name, value in raw.items()):
        return None
    return raw


def profile_of(raw: object) -> ExecutionProfile | None:
    """The execution profile a JSON object describes field for field; None if it is not one."""
    checked = _fields(raw, ExecutionProfile) if isinstance(raw, dict) else None
    return None if checked is None else ExecutionProfile(**checked)


def default_root() -> Path:
    """``$SEQKV_HOME/descriptions`` (an absolute path, else ``EnvironmentVariableError``), by
    default ``~/.cache/seqkv/descriptions``."""
    home = environment.path("SEQKV_HOME")
    base = home if home is not None else Path.home() / ".cache" / "seqkv"
    return base / "descriptions"


class DescriptionSource(Protocol):
    """Where a decoder finds a model's or profile's full description by digest (a
    ``Descriptions`` registry, or what a file carried itself)."""

    def model(self, digest: Digest) -> ModelIdentity | None: ...

    def profile(self, digest: Digest) -> ExecutionProfile | None: ...


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
        checked = None if raw is None else _fields(raw, ModelIdentity)
        identity = None if checked is None else ModelIdentity(**checked)
        return identity if identity is not None and model_digest(identity) == digest else None

    def profile(self, digest: Digest) -> ExecutionProfile | None:
        profile = profile_of(self._read("profiles", digest))
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
            with open(path, "rb") as stream:
                data = stream.read(MAX_DESCRIPTION_BYTES + 1)
            raw = load_json(data, "an entry", _Unreadable, MAX_DESCRIPTION_BYTES, 1)
        except (OSError, _Unreadable):
            return None
        return raw if isinstance(raw, dict) else None

"""A record of the connector calls an engine made, for replay by the CI driver.

Motivation: the CI machine cannot run vLLM (its CPU build pins another transformers), but the
order in which vLLM calls a connector (matches repeated, allocations, preemptions, resumptions,
which requests share a step) is what the connector must get right. With ``SEQKV_VLLM_TRACE`` set
to a file, ``SeqKVConnector`` appends one JSON object per call; ``tests/test_vllm_trace.py``
replays a committed trace through the same scheduler and worker code over transformers.

Each line holds ``call`` (the connector method) and its arguments as plain values: request ids,
token ids, block ids, counts, and the answer the connector gave. Nothing else (no KV).

Invariants:
1. A line is written whole, with one ``write`` of an ``O_APPEND`` file, so the scheduler's and
   the worker's processes may share one trace (enforced).
2. ``read_trace`` returns the events in file order and refuses a line that is not a JSON object
   with a ``call`` (enforced: ``CorruptFileError``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqkv.errors import CorruptFileError

TRACE_ENV = "SEQKV_VLLM_TRACE"
JsonValue = int | str | bool | None | list[Any] | dict[str, Any]


@dataclass(frozen=True)
class TraceEvent:
    call: str
    role: str
    """``scheduler`` or ``worker``."""
    args: tuple[tuple[str, JsonValue], ...]

    def get(self, name: str) -> JsonValue:
        for key, value in self.args:
            if key == name:
                return value
        raise KeyError(name)


class TraceWriter:
    """Appends events to ``path`` (see invariant 1)."""

    def __init__(self, path: str | Path, role: str) -> None:
        self.path = Path(path)
        self.role = role

    def write(self, call: str, **args: JsonValue) -> None:
        line = json.dumps({"call": call, "role": self.role, **args}, separators=(",", ":"))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def read_trace(path: str | Path) -> list[TraceEvent]:
    events = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CorruptFileError(f"trace line {number} is not JSON: {error}") from None
        if not isinstance(record, dict) or not isinstance(record.get("call"), str):
            raise CorruptFileError(f"trace line {number} is not an object with a 'call'")
        call = record.pop("call")
        role = str(record.pop("role", ""))
        events.append(TraceEvent(call, role, tuple(record.items())))
    return events

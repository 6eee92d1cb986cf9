"""The fuzz suite's shared harness: seeded mutations, one case at a time under a budget, tallies.

Every ``tests/test_fuzz_*.py`` runs its format's decoder on mutated files and requires each case
to end in a ``SeqKVError`` subclass or in exactly the original output, within ``BUDGET`` (time
per case, and growth of the process's peak resident memory beyond what the loaded fixtures
already hold). The mutations are drawn from ``numpy.random.default_rng(seed)``: the same seed
and case count give the same cases.

Kinds of mutation:

- random byte mutations of the whole file (bit flips, byte values, insertions, deletions,
  truncations, duplicated spans), checksum left as it is: the framing must refuse them;
- structural mutations whose checksum is recomputed, so that only validation can refuse them: a
  field of a known kind (varint, u8, float, digest, byte run) replaced by a hostile value
  (zero, negative as a two's complement byte, huge, NaN, infinities, a non-minimal or overlong
  varint, a wrong length), a section truncated, dropped, duplicated or swapped, bytes flipped
  inside one section;
- for JSON headers (formats of older versions): a value replaced by one of another type, a
  negative, zero, huge or non-finite number, deep nesting, a long string, a key deleted or
  added.

``SEQKV_FUZZ_CASES`` scales every test's case count (the CI default is small; ``scripts/fuzz.sh``
runs thousands), ``SEQKV_FUZZ_SEED`` changes the seed and ``SEQKV_FUZZ_REPORT`` names a folder
where each test writes its tally as JSON (cases, outcomes by class, max time and memory growth,
failures).
"""

from __future__ import annotations

import json
import math
import os
import resource
import struct
import time
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqkv.errors import SeqKVError
from seqkv.formats.framing import encode_varint, frame

CASES_ENV = "SEQKV_FUZZ_CASES"
SEED_ENV = "SEQKV_FUZZ_SEED"
REPORT_ENV = "SEQKV_FUZZ_REPORT"


@dataclass(frozen=True)
class Budget:
    """What one case may cost: seconds (the smaller of wall and process CPU time, see
    ``Tally.run``), and growth of the peak resident memory in bytes."""

    seconds: float = 2.0
    memory_bytes: int = 256 << 20


BUDGET = Budget()


def case_count(default: int) -> int:
    """``default`` cases, or ``SEQKV_FUZZ_CASES`` of them."""
    return int(os.environ.get(CASES_ENV, default))


def seed(offset: int) -> int:
    return int(os.environ.get(SEED_ENV, 0)) * 1_000_003 + offset


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


@dataclass
class Tally:
    """What the cases of one format ended in."""

    name: str
    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    max_seconds: float = 0.0
    slowest: str = ""
    baseline_rss: int = field(default_factory=_peak_rss)
    max_memory_growth: int = 0
    failures: list[str] = field(default_factory=list)

    def run(self, description: str, attempt: Callable[[], bool]) -> None:
        """Run one case: ``attempt`` decodes and returns whether the output is the original's
        (a ``SeqKVError`` is a refusal, anything else a failure)."""
        self.cases += 1
        started, started_cpu = time.perf_counter(), time.process_time()
        try:
            same = attempt()
        except SeqKVError as error:
            self.outcomes[type(error).__name__] += 1
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # constriction's PanicException is a BaseException
            where = traceback.extract_tb(error.__traceback__)[-1]
            site = f"{Path(where.filename).name}:{where.lineno}"
            self.outcomes[f"NOT SEQKV {type(error).__name__} at {site}"] += 1
            self.failures.append(f"{description}: {type(error).__name__} at {site}: "
                                 f"{str(error)[:200]}")
        else:
            if same:
                self.outcomes["original output"] += 1
            else:
                self.outcomes["WRONG OUTPUT"] += 1
                self.failures.append(f"{description}: decoded to another output")
        # NOTE: a case's cost is the smaller of its wall and CPU seconds: wall time grows with
        # whatever else the machine runs (a case measured 2.4 s at load average 14 that takes
        # 0.7 s on a quiet machine), CPU time with the threads a decode uses; runaway work
        # (a cycle walked, a forged count decoded) grows both.
        elapsed = min(time.perf_counter() - started, time.process_time() - started_cpu)
        if elapsed > self.max_seconds:
            self.max_seconds, self.slowest = elapsed, description
        self.max_memory_growth = max(self.max_memory_growth, _peak_rss() - self.baseline_rss)

    def to_json(self) -> dict[str, Any]:
        return {"format": self.name, "cases": self.cases, "outcomes": dict(self.outcomes),
                "max_seconds": round(self.max_seconds, 4), "slowest": self.slowest,
                "max_memory_growth_bytes": self.max_memory_growth,
                "failures": self.failures[:50]}

    def check(self, budget: Budget = BUDGET) -> None:
        """Write the report if asked, then assert every case ended well and within budget."""
        folder = os.environ.get(REPORT_ENV)
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            name = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name)
            (Path(folder) / f"{name}.json").write_text(json.dumps(self.to_json(), indent=1))
        assert not self.failures, "\n".join(self.failures[:20])
        assert self.max_seconds <= budget.seconds, (self.max_seconds, self.slowest)
        assert self.max_memory_growth <= budget.memory_bytes, self.max_memory_growth


@dataclass(frozen=True)
class Field:
    """A field of a section: where it lies and how to forge a hostile value for it."""

    offset: int
    length: int
    kind: str  # "u8", "varint", "f32", "f64", "bytes", "u16", "u32", "u64"
    name: str


class Walker:
    """Walks a valid section by its layout and records each field's place and kind."""

    def __init__(self, data: bytes, base: int = 0) -> None:
        self.data = data
        self.offset = 0
        self.base = base
        self.fields: list[Field] = []

    def _add(self, length: int, kind: str, name: str) -> bytes:
        chunk = self.data[self.offset : self.offset + length]
        self.fields.append(Field(self.base + self.offset, length, kind, name))
        self.offset += length
        return chunk

    def u8(self, name: str) -> int:
        return self._add(1, "u8", name)[0]

    def varint(self, name: str) -> int:
        value = shift = 0
        length = 0
        while True:
            byte = self.data[self.offset + length]
            value |= (byte & 0x7F) << shift
            shift += 7
            length += 1
            if not byte & 0x80:
                break
        self._add(length, "varint", name)
        return value

    def raw(self, length: int, name: str, kind: str = "bytes") -> bytes:
        return self._add(length, kind, name)

    def items(self, count: int, width: int, kind: str, name: str, limit: int = 64) -> None:
        """``count`` fixed-width items; at most ``limit`` of them become fields (spread)."""
        step = max(1, count // limit)
        for index in range(count):
            if index % step == 0:
                self.fields.append(Field(self.base + self.offset, width, kind,
                                         f"{name}[{index}]"))
            self.offset += width

    def rest(self, name: str) -> None:
        if self.offset < len(self.data):
            self._add(len(self.data) - self.offset, "bytes", name)


HOSTILE_INTEGERS = (0, 1, 2, 3, 7, 8, 15, 16, 63, 64, 65, 127, 128, 255, 256, 511, 512, 513,
                    1023, 1024, 4096, 4097, 8192, 65535, 65536, 1 << 22, (1 << 22) + 1,
                    (1 << 31) - 1, 1 << 31, (1 << 31) + 1, 1 << 32, 10**12, (1 << 56) - 1)
HOSTILE_FLOATS = (float("nan"), float("inf"), float("-inf"), -1.0, 0.0, -0.0, 1e-300, 5e-324,
                  1e-3, 2e-3, 8192.0, 8193.0, 1e30, 1e31, 3.4e38, 1e300, -5.0, 5.0)


def _hostile_integer(rng: np.random.Generator, current: int) -> int:
    if rng.random() < 0.3:
        return max(0, current + int(rng.choice([-2, -1, 1, 2])))
    return int(rng.choice(HOSTILE_INTEGERS))


def forge(rng: np.random.Generator, original: bytes, kind: str) -> tuple[str, bytes]:
    """A hostile replacement for a field of ``kind`` whose bytes are ``original``."""
    roll = rng.random()
    if kind == "varint":
        current = 0
        for index, byte in enumerate(original):
            current |= (byte & 0x7F) << (7 * index)
        if roll < 0.1:
            return "non-minimal", bytes([b | 0x80 for b in original]) + b"\x00"
        if roll < 0.15:
            return "overlong", b"\xff" * int(rng.integers(8, 12)) + b"\x01"
        if roll < 0.2:
            return "cut", original[:-1] + bytes([original[-1] | 0x80])
        value = _hostile_integer(rng, current)
        return f"={value}", encode_varint(value)
    if kind in ("f32", "f64"):
        value = float(rng.choice(HOSTILE_FLOATS))
        if kind == "f64":
            return f"={value}", struct.pack("<d", value)
        if math.isfinite(value) and abs(value) > 3.4e38:
            value = math.copysign(math.inf, value)  # what float32 makes of it
        return f"={value}", struct.pack("<f", value)
    if kind in ("u8", "u16", "u32", "u64"):
        width = len(original)
        value = _hostile_integer(rng, int.from_bytes(original, "little"))
        if roll < 0.3:
            value = int(rng.integers(0, 256)) << (8 * int(rng.integers(0, width)))
        return f"={value}", (value % (1 << (8 * width))).to_bytes(width, "little")
    if roll < 0.3:
        return "random", rng.bytes(len(original))
    if roll < 0.45:
        return "shorter", original[: int(rng.integers(0, max(1, len(original))))]
    if roll < 0.6:
        return "longer", original + rng.bytes(int(rng.integers(1, 9)))
    if roll < 0.75:
        return "zeros", bytes(len(original))
    if roll < 0.85:
        return "ones", b"\xff" * len(original)
    flipped = bytearray(original)
    if flipped:
        flipped[int(rng.integers(0, len(flipped)))] ^= 1 << int(rng.integers(0, 8))
    return "bit flip", bytes(flipped)


def mutate_bytes(rng: np.random.Generator, data: bytes) -> tuple[str, bytes]:
    """A random byte-level mutation of ``data`` (no checksum fixed)."""
    out = bytearray(data)
    kind = int(rng.integers(0, 7))
    where = int(rng.integers(0, max(1, len(out))))
    if kind == 0 and out:
        out[where] ^= 1 << int(rng.integers(0, 8))
        return f"flip bit at {where}", bytes(out)
    if kind == 1 and out:
        out[where] = int(rng.choice([0, 1, 0x7F, 0x80, 0xFF, int(rng.integers(0, 256))]))
        return f"set byte {where}", bytes(out)
    if kind == 2:
        out[where:where] = rng.bytes(int(rng.integers(1, 17)))
        return f"insert at {where}", bytes(out)
    if kind == 3:
        del out[where : where + int(rng.integers(1, 17))]
        return f"delete at {where}", bytes(out)
    if kind == 4:
        return f"truncate to {where}", bytes(out[:where])
    if kind == 5:
        span = out[where : where + int(rng.integers(1, 33))]
        out[where:where] = span
        return f"duplicate at {where}", bytes(out)
    return "append", bytes(out) + rng.bytes(int(rng.integers(1, 33)))


FieldMap = Callable[[Sequence[bytes]], list[list[Field]]]


def mutate_sections(rng: np.random.Generator, sections: list[bytes],
                    fields: list[list[Field]]) -> tuple[str, list[bytes]]:
    """A structural mutation of ``sections`` (see the module docstring)."""
    roll = rng.random()
    out = list(sections)
    if roll < 0.6:
        candidates = [(i, f) for i, section_fields in enumerate(fields) for f in section_fields]
        if candidates:
            index, chosen = candidates[int(rng.integers(0, len(candidates)))]
            section = out[index]
            what, forged = forge(rng, section[chosen.offset : chosen.offset + chosen.length],
                                 chosen.kind)
            out[index] = (section[: chosen.offset] + forged
                          + section[chosen.offset + chosen.length :])
            return f"section {index} field {chosen.name} {what}", out
    index = int(rng.integers(0, len(out))) if out else 0
    if roll < 0.75 and out:
        what, changed = mutate_bytes(rng, out[index])
        out[index] = changed
        return f"section {index}: {what}", out
    if roll < 0.82 and out:
        cut = int(rng.integers(0, len(out[index]) + 1))
        out[index] = out[index][:cut]
        return f"section {index} truncated to {cut}", out
    if roll < 0.87 and out:
        del out[index]
        return f"section {index} dropped", out
    if roll < 0.92 and out:
        out.insert(index, out[index])
        return f"section {index} duplicated", out
    if roll < 0.96 and len(out) > 1:
        other = int(rng.integers(0, len(out)))
        out[index], out[other] = out[other], out[index]
        return f"sections {index} and {other} swapped", out
    out.append(rng.bytes(int(rng.integers(0, 9))))
    return "a section appended", out


def mutate_framed(rng: np.random.Generator, sections: list[bytes], magic: bytes, version: int,
                  fields: list[list[Field]]) -> tuple[str, bytes]:
    """A structural mutation, reframed with a valid checksum (or, rarely, another version)."""
    what, changed = mutate_sections(rng, sections, fields)
    if rng.random() < 0.03:
        other = int(rng.integers(0, 256))
        return f"{what}; version {other}", frame(magic, other, changed)
    return what, frame(magic, version, changed)


_DEEP = "@deep@"


def _json_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += _json_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += _json_paths(item, (*path, index))
    return paths


def _hostile_json(rng: np.random.Generator) -> Any:
    choices: list[Any] = [None, True, False, -1, 0, 1, 2, 65, 2**31, 10**12, 10**30, 2**64,
                          -(2**63), 1.5, -0.5, float("nan"), float("inf"), float("-inf"), "",
                          "x" * 300, "tokens", "segments", "0" * 64, [], {}, [1, 2, 3],
                          {"a": 1}, [0.0] * 5, _DEEP, "9" * 5000]
    return choices[int(rng.integers(0, len(choices)))]


def mutate_json(rng: np.random.Generator, document: Any) -> tuple[str, bytes]:
    """The JSON text of ``document`` with one hostile change (see the module docstring)."""
    copy = json.loads(json.dumps(document))
    paths = _json_paths(copy)
    path = paths[int(rng.integers(0, len(paths)))]
    roll = rng.random()
    what = f"{'.'.join(map(str, path)) or '<root>'}"
    if not path:
        copy = _hostile_json(rng)
        what += " replaced"
    else:
        parent = copy
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        if roll < 0.15 and isinstance(parent, dict):
            del parent[key]
            what += " deleted"
        elif roll < 0.25 and isinstance(parent, dict):
            parent["extra"] = _hostile_json(rng)
            what += " with a key added"
        elif roll < 0.3 and isinstance(parent, list):
            parent.append(parent[key])
            what += " repeated"
        else:
            value = _hostile_json(rng)
            parent[key] = value
            what += f" = {str(value)[:20]}"
    text = json.dumps(copy).encode()
    if _DEEP.encode() in text:
        depth = int(rng.choice([5, 50, 1000, 100_000]))
        text = text.replace(json.dumps(_DEEP).encode(), b"[" * depth + b"]" * depth)
        what += f" (nesting {depth})"
    return what, text


def forged_count(rng: np.random.Generator, count: int, caps: Sequence[int]) -> int:
    """A token count to forge in place of ``count``: just past it, a multiple, or at and
    past one of ``caps`` (a context, a cap on model-free decodes)."""
    roll = rng.random()
    if roll < 0.3:
        return count + int(rng.integers(1, 4))
    if roll < 0.45:
        return count * int(rng.choice([2, 8, 100]))
    cap = int(rng.choice(list(caps)))
    return max(1, cap + int(rng.choice([-1, 0, 1])))


def forged_code(rng: np.random.Generator, data: bytes) -> tuple[str, bytes]:
    """A token code's bytes to put beside a forged count: kept, none, all zeros, all ones or
    random, up to a few hundred bytes (what an attacker's code can make a decoder do)."""
    kind = str(rng.choice(["kept", "empty", "zeros", "ones", "random"]))
    length = int(rng.integers(1, 400))
    code = {"kept": data, "empty": b"", "zeros": bytes(length), "ones": b"\xff" * length,
            "random": rng.bytes(length)}[kind]
    return f"{kind} code of {len(code)} bytes", code


def zlib_bomb(size: int) -> bytes:
    """A zlib stream of ``size`` zero bytes (about a thousandth of that)."""
    return zlib.compress(bytes(size), 9)


def test_mutations_are_reproducible() -> None:
    data = bytes(range(64))
    first = [mutate_bytes(np.random.default_rng(3), data) for _ in range(5)]
    second = [mutate_bytes(np.random.default_rng(3), data) for _ in range(5)]
    assert first == second


def test_a_foreign_exception_is_a_failure_and_a_refusal_is_not() -> None:
    tally = Tally("harness")
    tally.run("refused", lambda: (_ for _ in ()).throw(SeqKVError("no")))
    tally.run("same", lambda: True)
    assert not tally.failures
    tally.run("crash", lambda: [][1])
    tally.run("wrong", lambda: False)
    assert len(tally.failures) == 2 and tally.outcomes["WRONG OUTPUT"] == 1
    with pytest.raises(AssertionError):
        tally.check()


def test_the_walker_finds_every_varint() -> None:
    data = encode_varint(5) + encode_varint(300) + b"\x07"
    walker = Walker(data)
    assert (walker.varint("a"), walker.varint("b"), walker.u8("c")) == (5, 300, 7)
    assert [(f.offset, f.length, f.kind) for f in walker.fields] == [
        (0, 1, "varint"), (1, 2, "varint"), (3, 1, "u8")]

"""The store's span record: a versioned, checksummed binary frame around a codec payload.

A span is a run of tokens coded against a prefix (its parent span, cut at ``start`` tokens).
Per span the store keeps only this record: no JSON, no model identity or execution profile
(those live once per store, under ``codec`` as an index), no prefix hash (the parent is a span
id). Layout, integers as LEB128 varints unless noted::

    head      u8       RECORD_VERSION << 4 | flags (bit 0: kv_exact)
    codec     varint   index of the codec identity in the store's codec table
    parent    varint   parent span id, 0 for a span that starts at the session's first token
    start     varint   tokens of the prefix (the parent's chain cut to this length)
    payload   bytes    the codec's payload, to the end of the frame
    crc32     u32le    of everything before it (zlib.crc32)

Invariants:
1. ``unpack`` checks the length, the version, then the CRC before it parses a field, and raises
   ``CorruptRecordError`` naming which failed (enforced; one test each). Every field is then
   checked: minimal varints up to 2**63 - 1, known flags, a start exactly when there is a
   parent (below 2**31) (enforced; ``tests/test_fuzz_record.py``). The payload is the codec's to
   check.
2. ``unpack(pack(r)) == r`` (checked by a hypothesis round trip).
3. ``parent`` sits at a fixed place (after one byte and one varint) so a Redis Lua script can
   read it without knowing the payload (enforced by the layout; used by the delete cascade).

NOTE: the frame costs 1 + 1 + 1-4 + 1-3 + 4 = 8-13 bytes per span (measured in the store bench);
the checksum of the decoded tokens and KV lives in the codec payload, where the codec can check
it against what it decoded.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from seqkv.store.errors import CorruptRecordError
from seqkv.store.ids import SpanId

RECORD_VERSION = 1
MAX_VARINT = (1 << 63) - 1
# NOTE: 2**31 positions: more than any model's context (as ``seqkv.container.MAX_POSITIONS``).
MAX_START = 1 << 31
_CRC = struct.Struct("<I")
_MIN_SIZE = 1 + 3 + _CRC.size  # head, three one-byte varints, the CRC


def write_varint(out: bytearray, value: int) -> None:
    """Append ``0 <= value <= MAX_VARINT`` as an unsigned LEB128 varint."""
    assert 0 <= value <= MAX_VARINT, value
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it; ``ValueError`` past the end, past
    ``MAX_VARINT``, or in any but its minimal form (one encoding per value)."""
    value = 0
    shift = 0
    start = position
    while True:
        if position >= len(data):
            raise ValueError("a varint runs past the end of its record")
        if shift > 56:
            raise ValueError("a varint runs past 9 bytes")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and position - start > 1:
                raise ValueError("a varint is not in its minimal form")
            if value > MAX_VARINT:
                raise ValueError(f"a varint holds {value}, beyond 2**63 - 1")
            return value, position
        shift += 7


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One stored span."""

    codec: int
    parent: SpanId | None
    start: int
    kv_exact: bool
    payload: bytes

    def __post_init__(self) -> None:
        if (self.parent is None) != (self.start == 0):
            raise ValueError("a span starts at token 0 exactly when it has no parent")


def pack(record: SpanRecord) -> bytes:
    out = bytearray((RECORD_VERSION << 4 | (1 if record.kv_exact else 0),))
    write_varint(out, record.codec)
    write_varint(out, 0 if record.parent is None else int(record.parent))
    write_varint(out, record.start)
    out += record.payload
    out += _CRC.pack(zlib.crc32(out))
    return bytes(out)


def unpack(data: bytes) -> SpanRecord:
    if len(data) < _MIN_SIZE:
        raise CorruptRecordError(f"a span record of {len(data)} bytes is truncated")
    if data[0] >> 4 != RECORD_VERSION:
        raise CorruptRecordError(
            f"a span record has version {data[0] >> 4}; this seqkv reads version "
            f"{RECORD_VERSION}: use the seqkv release that wrote the store"
        )
    body = data[: -_CRC.size]
    if zlib.crc32(body) != _CRC.unpack_from(data, len(body))[0]:
        raise CorruptRecordError("a span record fails its CRC32: the stored bytes were damaged")
    flags = body[0] & 0x0F
    if flags > 1:
        raise CorruptRecordError(f"a span record has unknown flags {flags:#x}")
    try:
        codec, position = read_varint(body, 1)
        parent, position = read_varint(body, position)
        start, position = read_varint(body, position)
    except ValueError as error:
        raise CorruptRecordError(f"a span record is malformed: {error}") from None
    if (parent == 0) != (start == 0) or start > MAX_START:
        raise CorruptRecordError(
            f"a span record starts at token {start:,} with {'no ' if parent == 0 else ''}"
            f"parent: a span starts at 0 exactly when it has no parent, and before 2**31")
    return SpanRecord(codec, None if parent == 0 else SpanId(parent), start, flags == 1,
                      body[position:])


def frame_bytes(record: SpanRecord) -> int:
    """Bytes of ``pack(record)`` that are not the codec payload."""
    return len(pack(record)) - len(record.payload)

"""One envelope for every seqkv file format: magic, version, length-prefixed sections, checksum.

Every format seqkv writes (``.skv`` sessions, trie snapshots, mixing dictionaries, store records)
frames its bytes the same way, so each gets the same ordered checks and the same specific errors
for the same kinds of damage, and none allocates more than its input's size before its checksum
has passed::

    magic      4 bytes   per format; the first is 0x89 (not ASCII: catches text-mode mangling)
    version    u8        the format's version
    count      u8        number of sections
    lengths    varint    one per section (LEB128, at most 8 bytes each)
    sections   bytes     in order
    checksum   4 bytes   CRC-32 (zlib) of everything before it, little-endian

The checksum detects damage; it is not a cryptographic seal. Formats that must prove their
content store content digests inside their sections (``.skv`` keeps truncated SHA-256 digests of
the tokens and KV and verifies them after decoding).

Invariants:
1. ``unframe`` checks, in this order: empty input, magic, version, the declared lengths against
   the input's size (before any allocation), then the checksum; each failure raises the
   ``FramingErrors`` class the caller supplied for it (enforced; one test each).
2. ``unframe(frame(m, v, s), m, {v}) == (v, s)`` for any sections (checked by a property test).
3. This module imports nothing beyond the standard library and ``seqkv.errors`` (enforced by
   ``tests/test_layering.py``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from seqkv.errors import SeqKVError

MAGIC_BYTES = 4
CHECKSUM_BYTES = 4
_MAX_SECTIONS = 255
_MAX_VARINT_BYTES = 8


@dataclass(frozen=True)
class FramingErrors:
    """The exception class a format raises for each kind of damage."""

    empty: type[SeqKVError]
    not_this_format: type[SeqKVError]
    unsupported_version: type[SeqKVError]
    truncated: type[SeqKVError]
    corrupt: type[SeqKVError]


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128."""
    if value < 0:
        raise ValueError(f"a varint holds a non-negative integer, not {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: bytes | memoryview, offset: int) -> tuple[int, int] | None:
    """The varint at ``offset`` and the offset after it, or None if the data ends inside it or it
    runs past ``_MAX_VARINT_BYTES`` bytes."""
    value = shift = 0
    for index in range(offset, min(len(data), offset + _MAX_VARINT_BYTES)):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, index + 1
    return None


def frame(magic: bytes, version: int, sections: Sequence[bytes]) -> bytes:
    """The framed file of ``sections``."""
    if len(magic) != MAGIC_BYTES or magic[0] != 0x89:
        raise ValueError("a magic is 4 bytes starting with 0x89")
    if not 0 <= version <= 255 or len(sections) > _MAX_SECTIONS:
        raise ValueError("the version and the section count are single bytes")
    body = b"".join([magic, bytes([version, len(sections)]),
                     *(encode_varint(len(s)) for s in sections), *sections])
    return body + struct.pack("<I", zlib.crc32(body))


def framing_overhead(sections: Sequence[bytes]) -> int:
    """Bytes the envelope adds to ``sections``."""
    return (MAGIC_BYTES + 2 + sum(len(encode_varint(len(s))) for s in sections)
            + CHECKSUM_BYTES)


def peek_version(data: bytes, magic: bytes) -> int | None:
    """The version byte of a file with this magic, or None if it has another magic or none."""
    if len(data) <= MAGIC_BYTES or data[:MAGIC_BYTES] != magic:
        return None
    return data[MAGIC_BYTES]


def unframe(data: bytes, magic: bytes, versions: Collection[int], errors: FramingErrors,
            what: str, readable: Collection[int] | None = None) -> tuple[int, list[bytes]]:
    """The version and sections of a framed file, checked (see the module invariants).

    ``what`` names the format in messages ("the .skv file"); ``readable`` lists every version
    the format reads, older ones framed otherwise included (default: ``versions``).
    """
    if len(data) == 0:
        raise errors.empty(f"{what} is empty")
    if len(data) < MAGIC_BYTES or data[:MAGIC_BYTES] != magic:
        raise errors.not_this_format(f"{what} does not start with its magic bytes: it is not "
                                     "this kind of file")
    if len(data) < MAGIC_BYTES + 2:
        raise errors.truncated(f"{what} ends after {len(data)} bytes, inside its framing")
    version, count = data[MAGIC_BYTES], data[MAGIC_BYTES + 1]
    if version not in versions:
        raise errors.unsupported_version(
            f"{what} has format version {version}; this seqkv reads versions "
            f"{', '.join(map(str, sorted(readable or versions)))}: use the seqkv release that "
            "wrote it")
    offset = MAGIC_BYTES + 2
    lengths = []
    for _ in range(count):
        parsed = decode_varint(data, offset)
        if parsed is None:
            raise errors.truncated(f"{what} ends inside its section lengths")
        length, offset = parsed
        lengths.append(length)
    expected = offset + sum(lengths) + CHECKSUM_BYTES
    if len(data) < expected:
        raise errors.truncated(
            f"{what} is truncated: it has {len(data)} bytes, its framing says {expected}")
    if len(data) > expected:
        raise errors.corrupt(f"{what} has {len(data) - expected} unexpected bytes after its end")
    body = data[:-CHECKSUM_BYTES]
    (checksum,) = struct.unpack("<I", data[-CHECKSUM_BYTES:])
    if zlib.crc32(body) != checksum:
        raise errors.corrupt(f"{what} is corrupted: its checksum does not match")
    sections = []
    for length in lengths:
        sections.append(bytes(data[offset : offset + length]))
        offset += length
    return version, sections

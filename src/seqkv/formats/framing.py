"""One envelope for every seqkv file format: magic, version, length-prefixed sections, checksum.

Every format seqkv writes (``.skv`` sessions, trie snapshots, mixing dictionaries) frames its
bytes the same way, so each gets the same ordered checks and the same specific errors for the
same kinds of damage, and none allocates more than its input's size before its checksum has
passed::

    magic      4 bytes   per format; the first is 0x89 (not ASCII: catches text-mode mangling)
    version    u8        the format's version
    count      u8        number of sections
    lengths    varint    one per section (LEB128, at most 8 bytes each, minimal)
    sections   bytes     in order
    checksum   4 bytes   CRC-32 (zlib) of everything before it, little-endian

The checksum detects damage; it is not a cryptographic seal. A crafted file can carry a valid
checksum, so each format also validates every field it parses: this module gives them the tools
for that (``SectionReader`` for binary fields, ``inflate`` for zlib sections with a cap,
``load_json`` for the JSON headers of older formats), each raising the caller's error class.

Invariants:
1. ``unframe`` checks, in this order: empty input, magic, version, the declared lengths against
   the input's size (before any allocation), then the checksum; each failure raises the
   ``FramingErrors`` class the caller supplied for it (enforced; one test each).
2. ``unframe(frame(m, v, s), m, {v}) == (v, s)`` for any sections (checked by a property test).
3. A varint is read only in its minimal form: the encoding of a value is unique, so a file that
   parses re-encodes to the same bytes (enforced: a longer form is corruption).
4. ``inflate`` never holds more than ``size + 1`` inflated bytes, whatever the input claims
   (enforced: streaming with ``max_length``).
5. This module imports nothing beyond the standard library and ``seqkv.errors`` (enforced by
   ``tests/test_layering.py``).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from seqkv.errors import SeqKVError
from seqkv.limits import MAX_VARINT, MAX_VARINT_BYTES

MAGIC_BYTES = 4
CHECKSUM_BYTES = 4
_MAX_SECTIONS = 255
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")


@dataclass(frozen=True)
class FramingErrors:
    """The exception class a format raises for each kind of damage."""

    empty: type[SeqKVError]
    not_this_format: type[SeqKVError]
    unsupported_version: type[SeqKVError]
    truncated: type[SeqKVError]
    corrupt: type[SeqKVError]


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128, minimal: the one varint of every seqkv format (the store's Redis
    scripts read the same, ``seqkv.store.backends.redis``).

    >>> encode_varint(300).hex()
    'ac02'
    """
    if value < 0 or value > MAX_VARINT:
        raise ValueError(f"a varint holds an integer in [0, 2**53), not {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class VarintError(ValueError):
    """A varint that is cut short, longer than 8 bytes, above ``MAX_VARINT``, or not in its
    minimal form."""

    def __init__(self, reason: str, truncated: bool) -> None:
        super().__init__(reason)
        self.truncated = truncated


def read_varint(data: bytes | memoryview, offset: int) -> tuple[int, int]:
    """The varint at ``offset`` and the offset after it, or ``VarintError``."""
    value = shift = 0
    for index in range(offset, min(len(data), offset + MAX_VARINT_BYTES)):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if byte == 0 and index > offset:
                raise VarintError("an integer is not in its minimal form", truncated=False)
            if value > MAX_VARINT:
                raise VarintError(f"an integer is {value:,}, above 2**53 - 1", truncated=False)
            return value, index + 1
    if len(data) < offset + MAX_VARINT_BYTES:
        raise VarintError("the data ends inside an integer", truncated=True)
    raise VarintError(f"an integer runs past {MAX_VARINT_BYTES} bytes", truncated=False)


def decode_varint(data: bytes | memoryview, offset: int) -> tuple[int, int] | None:
    """The varint at ``offset`` and the offset after it, or None where ``read_varint`` fails."""
    try:
        return read_varint(data, offset)
    except VarintError:
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
        try:
            length, offset = read_varint(data, offset)
        except VarintError as error:
            if error.truncated:
                raise errors.truncated(f"{what} ends inside its section lengths") from None
            raise errors.corrupt(f"{what} has a malformed section length: {error}") from None
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


class SectionReader:
    """Reads the fields of one section in order; every failure raises ``error`` naming the field.

    ``what`` names the section in messages ("the .skv header").
    """

    def __init__(self, data: bytes, what: str, error: type[SeqKVError]) -> None:
        self.data = data
        self.offset = 0
        self.what = what
        self.error = error

    def fail(self, message: str) -> SeqKVError:
        """The error to raise for ``message`` about this section."""
        return self.error(f"{self.what} {message}")

    @property
    def remaining(self) -> int:
        return len(self.data) - self.offset

    def take(self, count: int, name: str) -> bytes:
        if count < 0 or count > self.remaining:
            raise self.fail(f"ends inside its {name}")
        chunk = self.data[self.offset : self.offset + count]
        self.offset += count
        return chunk

    def u8(self, name: str) -> int:
        return self.take(1, name)[0]

    def varint(self, name: str, low: int = 0, high: int = MAX_VARINT) -> int:
        """A varint in ``[low, high]``."""
        try:
            value, self.offset = read_varint(self.data, self.offset)
        except VarintError as error:
            if error.truncated:
                raise self.fail(f"ends inside its {name}") from None
            raise self.fail(f"has a malformed {name}: {error}") from None
        if not low <= value <= high:
            raise self.fail(f"has {name} {value:,}, outside [{low:,}, {high:,}]")
        return value

    def f32(self, name: str) -> float:
        return float(_F32.unpack(self.take(4, name))[0])

    def f64(self, name: str) -> float:
        return float(_F64.unpack(self.take(8, name))[0])

    def finite(self, value: float, name: str, low: float, high: float) -> float:
        """``value`` if it is finite and within ``[low, high]``."""
        if not (math.isfinite(value) and low <= value <= high):
            raise self.fail(f"has {name} {value!r}, not a finite number in [{low:g}, {high:g}]")
        return value

    def rest(self) -> bytes:
        chunk = self.data[self.offset :]
        self.offset = len(self.data)
        return chunk

    def finish(self) -> None:
        """Refuse bytes after the last field."""
        if self.offset != len(self.data):
            raise self.fail(f"has {self.remaining} unexpected bytes after its fields")


def inflate(data: bytes, size: int, what: str, error: type[SeqKVError]) -> bytes:
    """The zlib stream ``data`` inflated, which must give exactly ``size`` bytes and end there.

    Streaming with a cap: at most ``size + 1`` bytes are ever inflated (a "zip bomb" costs no
    more memory than the size the caller expects, which it has bounded beforehand).
    """
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, size + 1)
    except zlib.error as failure:
        raise error(f"{what} does not inflate: {failure}") from None
    if len(out) > size:
        raise error(f"{what} inflates to more than the {size:,} bytes its shape allows")
    if not inflater.eof:
        raise error(f"{what} inflates to {len(out):,} bytes, not {size:,}: its stream is cut "
                    "short")
    if len(out) != size:
        raise error(f"{what} inflates to {len(out):,} bytes, not {size:,}")
    if inflater.unused_data:
        raise error(f"{what} has {len(inflater.unused_data)} bytes after its zlib stream")
    return out


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (strings skipped), without
    parsing it: a guard that runs before ``json.loads`` can recurse. One pass, linear in the
    input (a regular expression over strings backtracks quadratically on an unterminated one
    of escaped quotes)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("an object repeats a key")
    return result


def load_json(data: bytes, what: str, error: type[SeqKVError], max_bytes: int,
              max_depth: int) -> Any:
    """Parse JSON text of at most ``max_bytes`` bytes and ``max_depth`` levels of nesting; NaN,
    Infinity and repeated keys are refused. Every failure raises ``error``."""
    if len(data) > max_bytes:
        raise error(f"{what} has {len(data):,} bytes, more than the {max_bytes:,} it may hold")
    if json_depth(data) > max_depth:
        raise error(f"{what} nests deeper than {max_depth} levels")
    try:
        return json.loads(data, parse_constant=_refuse_constant,
                          object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as failure:
        raise error(f"{what} is not valid JSON: {failure}") from None

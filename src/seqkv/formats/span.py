"""The store's span record: a coded session continuing its parent span, in a small checksummed
frame. A sibling format of ``.skv`` (``seqkv.formats.skv``), of the same value
(``seqkv.session.CodedSession``), with no ``.skv`` in between.

A span is a run of tokens coded against a prefix: its parent span's chain, cut at ``start``
tokens. Per span the store keeps only this record: no model identity, execution profile, level
or vocabulary (those live once per store, in the codec's identity, as an index), no prefix hash
(the parent is a span id). Record version 3 (the version written), integers as varints
(``seqkv.formats.framing``)::

    head       u8       3 << 4 | flags: bit 0 the KV is exact, bit 1 a residual follows, bit 2
                        a dictionary digest follows, bit 3 a KV digest follows
    codec      varint   index of the codec identity in the store's codec table
    parent     varint   parent span id, 0 for a span that starts at the session's first token
    start      varint   tokens of the prefix (the parent's chain cut to this length)
    count      varint   tokens coded
    padding    u8       unused bits at the token code's end, 0 to 7 (they are zeros)
    tokens     8 bytes  digest of the chain's tokens, the prefix's included
    [KV]       8 bytes  digest of the KV after the prefix (``kv_scope`` "tail": the parent's
                        decode verified the prefix's)
    [dict]     32 bytes digest of the mixing dictionary the span was coded with
    [residual] varint length, then the residual as a .skv file's third section holds it
    code       bytes    the token code: exactly the bits ``ArithmeticEncoder.finish`` writes,
                        floor included (``code_form`` "floored", as ``.skv`` format 5), so its
                        bit length is ``8 * len(code) - padding``
    crc32      u32le    of everything before it (zlib.crc32)

Version 2 (written before) is version 3 without ``padding``: its code's bit length is not kept
(the decoder reads zeros past a stream's end and the unused bits of the last byte are zeros), so
its decoder cannot tell where the code ends and runs no information guard (``code_form``
"bytes"). Version 1 framed an opaque codec payload after ``start``; its two payload layouts
(``Version1Layout``) are read into the same fields, with ``kv_scope`` "all" (their KV digest
covered the whole chain's KV) and ``code_form`` "bytes".

Invariants:
1. ``read_span`` checks the length, the version, then the CRC before it parses a field, and
   raises ``CorruptRecordError`` naming which failed (enforced; one test each). Every field is
   then checked against ``seqkv.limits`` (enforced; ``tests/test_fuzz_record.py``).
2. ``read_span(write_span(r)) == r`` for every version-3 record (checked by a hypothesis round
   trip), and a version-2 or 3 record is read only in the form ``write_span`` writes (minimal
   varints, zero padding, known flags). What this reader cannot tell without decoding, the
   store's decoders check: a version-3 code that is not the encoder's floored bits, a version-2
   code that is not the encoder's bits packed to whole bytes (a byte after it;
   ``ArithmeticDecoder.canonical`` and ``canonical_bytes``, both codecs), a token count the
   code cannot carry (version 3: ``seqkv.levels.model_free.check_model_free_decode`` before
   decoding, the information guard while decoding) and a ``start`` outside its parent's own
   tokens (``seqkv.store.chains`` invariant 5), each ``CorruptRecordError`` (enforced;
   ``tests/test_store_integrity.py``).
3. ``parent`` sits at a fixed place (after one byte and one varint) in every version, so a
   Redis Lua script can read it without parsing the rest (enforced by the layout; used by the
   delete cascade, which reads only the versions ``READABLE_SPAN_VERSIONS`` names).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Literal

from seqkv.coding.arithmetic import BitStream
from seqkv.coding.residual_code import ResidualCode
from seqkv.digests import DIGEST_BYTES, Digest
from seqkv.errors import CorruptFileError, CorruptRecordError
from seqkv.formats.framing import SectionReader, VarintError, encode_varint, read_varint
from seqkv.formats.residual import (
    DICTIONARY_DIGEST_BYTES,
    decode_residual_section,
    encode_residual_section,
)
from seqkv.limits import MAX_POSITIONS
from seqkv.session import CodeForm, KVScope

SPAN_VERSION = 3
READABLE_SPAN_VERSIONS = (1, 2, 3)
_CRC = struct.Struct("<I")
_FLAG_EXACT, _FLAG_RESIDUAL, _FLAG_DICTIONARY, _FLAG_KV = 1, 2, 4, 8
Version1Layout = Literal["skv", "skv+dictionary", "tokens"]
"""The payload a version-1 record framed: ``seqkv.store``'s former ``.skv`` adapter (its
tokens and KV digests, a residual, the code; with a dictionary digest at a mixing level), or its
tokens-only codec (the tokens digest and the code)."""


@dataclass(frozen=True)
class SpanRecord:
    """One stored span: where it continues, and its coded session's per-span fields."""

    codec: int
    parent: int | None  # span id
    start: int
    kv_exact: bool
    count: int
    tokens_digest: Digest
    kv_digest: Digest | None
    dictionary: str | None
    residual: ResidualCode | None
    token_code: BitStream
    kv_scope: KVScope = "tail"
    # What the token code's writer promised (``seqkv.session`` invariant 4): "floored" in a
    # version-3 record, "bytes" in one of version 1 or 2
    code_form: CodeForm = "floored"

    def __post_init__(self) -> None:
        if (self.parent is None) != (self.start == 0):
            raise ValueError("a span starts at token 0 exactly when it has no parent")


@dataclass(frozen=True)
class SpanFrame:
    """The fields of a record every version has at the same place, and what follows them."""

    version: int
    codec: int
    parent: int | None
    start: int
    kv_exact: bool
    flags: int
    body: bytes  # after ``start``, before the CRC


def write_span(record: SpanRecord) -> bytes:
    """``record`` as version 3 (its KV digest must cover the tail: ``kv_scope`` "tail"; its
    token code must be the encoder's floored bits: ``code_form`` "floored")."""
    if record.kv_scope != "tail":
        raise ValueError("a version-3 span's KV digest covers the positions after its prefix")
    if record.code_form != "floored":
        raise ValueError(f"a version-3 span holds a floored token code, not one of form "
                         f"{record.code_form!r}")
    if record.residual is not None and record.kv_digest is None:
        raise ValueError("a span with a residual records its KV digest")
    flags = ((_FLAG_EXACT if record.kv_exact else 0)
             | (_FLAG_RESIDUAL if record.residual is not None else 0)
             | (_FLAG_DICTIONARY if record.dictionary is not None else 0)
             | (_FLAG_KV if record.kv_digest is not None else 0))
    code = record.token_code
    if 8 * len(code.data) - code.num_bits >= 8:
        raise ValueError("a token code's data holds whole unused bytes")
    out = bytearray((SPAN_VERSION << 4 | flags,))
    for value in (record.codec, 0 if record.parent is None else record.parent, record.start,
                  record.count):
        out += encode_varint(value)
    out.append(8 * len(code.data) - code.num_bits)
    out += record.tokens_digest
    if record.kv_digest is not None:
        out += record.kv_digest
    if record.dictionary is not None:
        out += bytes.fromhex(record.dictionary)
    if record.residual is not None:
        residual = encode_residual_section(record.residual)
        out += encode_varint(len(residual)) + residual
    out += code.data
    out += _CRC.pack(zlib.crc32(out))
    return bytes(out)


def read_frame(data: bytes) -> SpanFrame:
    """The fixed fields of a record of any readable version, after its length, version and CRC
    are checked."""
    if len(data) < 1 + 3 + _CRC.size:
        raise CorruptRecordError(f"a span record of {len(data)} bytes is truncated")
    version, flags = data[0] >> 4, data[0] & 0x0F
    if version not in READABLE_SPAN_VERSIONS:
        raise CorruptRecordError(
            f"a span record has version {version}; this seqkv reads versions "
            f"{', '.join(map(str, READABLE_SPAN_VERSIONS))}: use the seqkv release that wrote "
            "the store")
    body = data[: -_CRC.size]
    if zlib.crc32(body) != _CRC.unpack_from(data, len(body))[0]:
        raise CorruptRecordError("a span record fails its CRC32: the stored bytes were damaged")
    if version == 1 and flags > _FLAG_EXACT:
        raise CorruptRecordError(f"a version-1 span record has unknown flags {flags:#x}")
    try:
        codec, position = read_varint(body, 1)
        parent, position = read_varint(body, position)
        start, position = read_varint(body, position)
    except VarintError as error:
        raise CorruptRecordError(f"a span record is malformed: {error}") from None
    if (parent == 0) != (start == 0) or start > MAX_POSITIONS:
        raise CorruptRecordError(
            f"a span record starts at token {start:,} with {'no ' if parent == 0 else ''}"
            f"parent: a span starts at 0 exactly when it has no parent, and before 2**31")
    return SpanFrame(version, codec, None if parent == 0 else parent, start,
                     bool(flags & _FLAG_EXACT), flags, body[position:])


def read_span(data: bytes, layout: Version1Layout | None = None) -> SpanRecord:
    """A record of either version; a version-1 record needs the ``layout`` its codec wrote
    (``CorruptRecordError`` without it)."""
    frame = read_frame(data)
    try:
        if frame.version >= 2:
            return _version2(frame, padded=frame.version == SPAN_VERSION)
        if layout is None:
            raise CorruptRecordError("a version-1 span record is read with its codec's layout")
        return _version1(frame, layout)
    except (CorruptFileError, VarintError, ValueError) as error:
        if isinstance(error, CorruptRecordError):
            raise
        raise CorruptRecordError(f"a span record is malformed: {error}") from None


def _version2(frame: SpanFrame, padded: bool) -> SpanRecord:
    """A record of version 3 (``padded``) or 2."""
    reader = SectionReader(frame.body, "a span record", CorruptRecordError)
    count = reader.varint("token count", 1, MAX_POSITIONS - frame.start)
    padding = reader.u8("code padding") if padded else 0
    if padding > 7:
        raise reader.fail(f"has {padding} unused bits at its token code's end, not 0 to 7")
    tokens = Digest(reader.take(DIGEST_BYTES, "tokens digest"))
    kv = Digest(reader.take(DIGEST_BYTES, "KV digest")) if frame.flags & _FLAG_KV else None
    dictionary = (reader.take(DICTIONARY_DIGEST_BYTES, "dictionary digest").hex()
                  if frame.flags & _FLAG_DICTIONARY else None)
    residual = None
    if frame.flags & _FLAG_RESIDUAL:
        if kv is None:
            raise CorruptRecordError("a span record holds a residual but no KV digest")
        length = reader.varint("residual length", 1, reader.remaining)
        residual = decode_residual_section(reader.take(length, "residual"))
    data = reader.rest()
    if padding and (not data or data[-1] & ((1 << padding) - 1)):
        raise reader.fail(f"declares {padding} unused bits at its token code's end, which are "
                          "not zeros of a last byte")
    return SpanRecord(frame.codec, frame.parent, frame.start, frame.kv_exact, count, tokens, kv,
                      dictionary, residual, BitStream(data, 8 * len(data) - padding), "tail",
                      "floored" if padded else "bytes")


def _version1(frame: SpanFrame, layout: Version1Layout) -> SpanRecord:
    payload = frame.body
    if layout == "tokens":
        count, position = read_varint(payload, 0)
        tokens = Digest(payload[position : position + DIGEST_BYTES])
        if count < 1 or len(tokens) != DIGEST_BYTES:
            raise CorruptRecordError("a span payload's lengths do not add up")
        return SpanRecord(frame.codec, frame.parent, frame.start, frame.kv_exact, count, tokens,
                          None, None, None, _code(payload[position + DIGEST_BYTES :]), "all",
                          "bytes")
    head, position = read_varint(payload, 0)
    mixes = layout == "skv+dictionary"
    count = head >> 2 if mixes else head >> 1
    tokens = Digest(payload[position : position + DIGEST_BYTES])
    kv = Digest(payload[position + DIGEST_BYTES : position + 2 * DIGEST_BYTES])
    position += 2 * DIGEST_BYTES
    dictionary = None
    if mixes and head & 2:
        dictionary = payload[position : position + DICTIONARY_DIGEST_BYTES].hex()
        position += DICTIONARY_DIGEST_BYTES
    if count < 1 or len(kv) != DIGEST_BYTES or position > len(payload) or (
            dictionary is not None and len(dictionary) != 2 * DICTIONARY_DIGEST_BYTES):
        raise CorruptRecordError("a span payload's lengths do not add up")
    residual = None
    if head & 1:
        length, position = read_varint(payload, position)
        if position + length > len(payload):
            raise CorruptRecordError("a span payload's residual runs past its end")
        residual = decode_residual_section(payload[position : position + length])
        position += length
    return SpanRecord(frame.codec, frame.parent, frame.start, frame.kv_exact, count, tokens, kv,
                      dictionary, residual, _code(payload[position:]), "all", "bytes")


def _code(data: bytes) -> BitStream:
    return BitStream(data, 8 * len(data))


def span_parts(record: SpanRecord) -> dict[str, int]:
    """The size of each part of ``write_span(record)``, computed apart from the writer (the
    record's byte-accounting bound compares their sum with what it wrote)."""
    residual = 0
    if record.residual is not None:
        section = len(encode_residual_section(record.residual))
        residual = len(encode_varint(section)) + section
    fields = (record.codec, 0 if record.parent is None else record.parent, record.start,
              record.count)
    return {"head": 2 + sum(len(encode_varint(value)) for value in fields),
            "digests": DIGEST_BYTES * (1 + (record.kv_digest is not None))
            + (DICTIONARY_DIGEST_BYTES if record.dictionary is not None else 0),
            "residual_code": residual, "token_code": len(record.token_code.data),
            "checksum": _CRC.size}

"""The stored form of one warm entry (``seqkv.warm``, the vLLM connector's warm tier): header,
payload, checksum, in the envelope of ``seqkv.formats.framing``.

Motivation: the layout lives with seqkv's other byte layouts, apart from the codecs, so that the
bytes a store keeps are stated once and read without torch or a model (constriction's split:
coders return values, a format module writes bytes). The coding's fields are stored as ids;
``seqkv.warm.config`` maps them to the configs a codec runs with and refuses ids it does not
know.

Layout (magic ``\\x89SKW``, version 2, two sections, CRC-32 over everything before it)::

    header   model digest     8 bytes   the model that produced the KV (WarmModel.digest)
             flags            u8        bit 0: a tag follows
             tag              8 bytes   what the entry stands for (tokens' digest, a cache key)
             coding           u8        0 or 1 lossy (the predictor: none, previous-token),
                                        2 exact
             lossy:  [group]  varint    previous-token only: its group size G
                     [ref]    u8        previous-token only: 0 the previous position, 1 the
                                        group's anchor
                     quantizer u8       id in ``seqkv.warm.config.QUANTIZER_IDS``
                     bits     u8        residual width
                     seed     varint    TurboQuant's rotation seed
             exact:  dtype    u8        id in ``seqkv.warm.config.EXACT_DTYPES``
             geometry         varints   layers, kv_heads, head_dim
             tokens           varint    positions in the entry
    payload  bytes                      lossy: WarmCodec's stored fields, their length fixed by
                                        the above; exact: an exact payload (below)

An exact payload (``ExactPayload``; what each plane holds is ``seqkv.warm.exact``'s)::

    digest       8 bytes   seqkv.digests.digest of the segment's values
    top length   varint    bytes of the zlib stream that follows
    top plane    zlib      the top byte of every value
    low planes   bytes     the other bytes of every value, their length fixed by the header

Version 1 had no exact coding (its coding byte was 0 or 1); its entries are read as before, and
an older seqkv refuses a version-2 entry by its version (``UnsupportedVersionError``).

Invariants:
1. ``read_entry`` checks, in order: the envelope (magic, version, lengths, CRC-32:
   ``CorruptFileError`` and its siblings), then every header field's range this layout fixes
   (flags, coding, group size, reference, geometry, token count; ``CorruptFileError``)
   (enforced; a test each). ``seqkv.warm.entry`` then checks the ids against its tables, the
   model digest (``ModelMismatchError``: ``check_entry``) and the tag (``WarmTagMismatchError``).
2. ``read_entry(write_entry(h, p)) == (h, p)`` for every header whose fields are in range, and a
   header is read only in the form ``write_entry`` writes (minimal varints, no trailing bytes)
   (enforced by ``SectionReader``; checked by a round trip).
3. Every byte of an entry is counted in its size: ``len(write_entry(...))`` is what a store
   keeps (enforced by construction).
4. The checksum detects damage, not forgery; what a crafted entry with a valid CRC can decode
   to is bounded by its codec (``seqkv.warm`` invariant 3).
5. This module imports neither torch nor the model layer (enforced by ``tests/test_layering.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqkv.digests import DIGEST_BYTES, Digest, hex_digest
from seqkv.errors import (
    CorruptFileError,
    ModelMismatchError,
    NotASeqKVFileError,
    TruncatedFileError,
    UnsupportedVersionError,
    WarmTagMismatchError,
)
from seqkv.formats.framing import FramingErrors, SectionReader, encode_varint, frame, unframe
from seqkv.limits import MAX_WARM_GEOMETRY, MAX_WARM_TOKENS
from seqkv.types import KVGeometry

MAGIC = b"\x89SKW"
VERSION = 2
READ_VERSIONS = frozenset({1, VERSION})
ERRORS = FramingErrors(CorruptFileError, NotASeqKVFileError, UnsupportedVersionError,
                       TruncatedFileError, CorruptFileError)
WHAT = "the warm entry"
HEADER = "the warm entry's header"
NO_PREDICTION, PREVIOUS_TOKEN, EXACT_CODING = 0, 1, 2
"""The coding byte: the lossy predictors' ids, then the exact coding's."""
REFERENCES = 2
"""Reference ids of a previous-token predictor: 0 the previous position, 1 the anchor."""


@dataclass(frozen=True)
class LossyCoding:
    """A lossy entry's coding fields, as stored."""

    predictor: int
    """``NO_PREDICTION`` or ``PREVIOUS_TOKEN``."""
    group_size: int
    """Stored for ``PREVIOUS_TOKEN`` only; 1 otherwise."""
    reference: int
    """Stored for ``PREVIOUS_TOKEN`` only; 0 otherwise."""
    quantizer: int
    bits: int
    seed: int


@dataclass(frozen=True)
class ExactCoding:
    """An exact entry's coding field, as stored."""

    dtype: int


Coding = LossyCoding | ExactCoding


@dataclass(frozen=True)
class EntryHeader:
    """A warm entry's header fields, as stored."""

    model: Digest
    tag: Digest | None
    coding: Coding
    geometry: KVGeometry
    num_tokens: int


def coding_bytes(coding: Coding) -> bytes:
    """The coding's stored bytes (what ``seqkv.warm.config``'s ``config_bytes`` return).

    >>> coding_bytes(ExactCoding(1))
    b'\\x02\\x01'
    >>> coding_bytes(LossyCoding(PREVIOUS_TOKEN, 16, 0, 0, 3, 0)).hex()
    '011000000300'
    """
    if isinstance(coding, ExactCoding):
        return bytes([EXACT_CODING, coding.dtype])
    predictor = bytes([coding.predictor])
    if coding.predictor == PREVIOUS_TOKEN:
        predictor += encode_varint(coding.group_size) + bytes([coding.reference])
    return predictor + bytes([coding.quantizer, coding.bits]) + encode_varint(coding.seed)


def header_bytes(header: EntryHeader) -> bytes:
    g = header.geometry
    tag = b"" if header.tag is None else bytes(header.tag)
    return b"".join([bytes(header.model), bytes([0 if header.tag is None else 1]), tag,
                     coding_bytes(header.coding), encode_varint(g.layers),
                     encode_varint(g.kv_heads), encode_varint(g.head_dim),
                     encode_varint(header.num_tokens)])


def write_entry(header: EntryHeader, payload: bytes) -> bytes:
    """The framed entry (every byte a store keeps)."""
    return frame(MAGIC, VERSION, [header_bytes(header), payload])


def header_error(message: str) -> CorruptFileError:
    """The error for a header field out of range: ``message`` names the field."""
    return CorruptFileError(f"{HEADER} {message}")


def _read_coding(reader: SectionReader, version: int) -> Coding:
    kind = reader.u8("coding")
    if kind == EXACT_CODING and version >= 2:
        return ExactCoding(reader.u8("dtype"))
    if kind > PREVIOUS_TOKEN:
        raise reader.fail(f"names unknown coding {kind} (version {version})")
    group = reader.varint("group size", 1, MAX_WARM_TOKENS) if kind else 1
    reference = reader.u8("reference") if kind else 0
    if reference >= REFERENCES:
        raise reader.fail(f"names unknown reference {reference}")
    quantizer = reader.u8("quantizer")
    bits = reader.u8("bits")
    return LossyCoding(kind, group, reference, quantizer, bits, reader.varint("seed"))


def read_header(data: bytes, version: int) -> EntryHeader:
    """The header section's fields, each in the range this layout fixes (invariant 1)."""
    reader = SectionReader(data, HEADER, CorruptFileError)
    model = Digest(reader.take(DIGEST_BYTES, "model digest"))
    flags = reader.u8("flags")
    if flags > 1:
        raise reader.fail(f"has unknown flags {flags:#x}")
    tag = Digest(reader.take(DIGEST_BYTES, "tag")) if flags else None
    coding = _read_coding(reader, version)
    layers = reader.varint("layers", 1, MAX_WARM_GEOMETRY)
    heads = reader.varint("kv heads", 1, MAX_WARM_GEOMETRY)
    head_dim = reader.varint("head dim", 2, MAX_WARM_GEOMETRY)
    tokens = reader.varint("token count", 1, MAX_WARM_TOKENS)
    reader.finish()
    return EntryHeader(model, tag, coding, KVGeometry(layers, heads, head_dim), tokens)


def read_entry(data: bytes) -> tuple[EntryHeader, bytes]:
    """The header fields and the payload of an entry, its envelope and header checked."""
    version, sections = unframe(data, MAGIC, READ_VERSIONS, ERRORS, WHAT)
    if len(sections) != 2:
        raise CorruptFileError(f"{WHAT} has {len(sections)} sections, not 2: it is damaged")
    return read_header(sections[0], version), sections[1]


def check_entry(header: EntryHeader, model: Digest, geometry: KVGeometry,
                tag: Digest | None = None) -> None:
    """Refuse an entry of another model or geometry (``ModelMismatchError``), or one whose tag
    is not ``tag`` when one is given (``WarmTagMismatchError``)."""
    if header.model != model or header.geometry != geometry:
        raise ModelMismatchError(
            f"{WHAT} holds KV of model {hex_digest(header.model)} ({header.geometry}); this is "
            f"model {hex_digest(model)} ({geometry}): load it with the model that "
            "produced it, or recompute"
        )
    if tag is not None and header.tag != tag:
        got = "no tag" if header.tag is None else f"tag {hex_digest(header.tag)}"
        raise WarmTagMismatchError(
            f"{WHAT} has {got}, not {hex_digest(tag)}: it stands for other tokens (a misfiled "
            "or stale entry); recompute the KV"
        )


@dataclass(frozen=True)
class ExactPayload:
    """The fields of an exact entry's payload (one segment)."""

    digest: Digest
    top: bytes
    """The zlib stream of the top plane."""
    low: bytes
    """The low planes, one after the other."""


def write_exact_payload(digest: Digest, top: bytes, low_planes: Sequence[bytes]) -> bytes:
    """The payload of these fields (``low_planes`` joined as they are, copied once)."""
    return b"".join([bytes(digest), encode_varint(len(top)), top, *low_planes])


def read_exact_payload(data: bytes, low_bytes: int, what: str) -> ExactPayload:
    """An exact payload whose low planes hold ``low_bytes`` (the geometry and dtype fix them),
    every length checked against ``data`` before anything is copied (``CorruptFileError``
    naming ``what``)."""
    reader = SectionReader(data, what, CorruptFileError)
    stored = Digest(reader.take(DIGEST_BYTES, "digest"))
    length = reader.varint("top plane length", 0, reader.remaining)
    top = reader.take(length, "top plane")
    low = reader.take(low_bytes, "low planes")
    reader.finish()
    return ExactPayload(stored, top, low)


def exact_payload_side_bytes(data: bytes, what: str) -> int:
    """The bytes of an exact payload that are not coded planes (its digest and the top plane's
    length), read without copying the planes."""
    reader = SectionReader(data, what, CorruptFileError)
    reader.take(DIGEST_BYTES, "digest")
    reader.varint("top plane length", 0, reader.remaining)
    return len(data) - reader.remaining

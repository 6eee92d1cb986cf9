"""The stored form of one warm entry: header, payload, checksum (the envelope of
``seqkv.formats.framing``).

Layout (magic ``\\x89SKW``, version 2, two sections, CRC-32 over everything before it)::

    header   model digest     8 bytes   the model that produced the KV (WarmModel.digest)
             flags            u8        bit 0: a tag follows
             tag              8 bytes   what the entry stands for (tokens' digest, a cache key)
             config           bytes     its first byte the coding: 0 or 1 lossy (the predictor:
                                        none, previous-token), 2 exact.
                                        lossy: WarmConfig.config_bytes(): predictor, G,
                                        reference, quantizer, bits, seed;
                                        exact: ExactConfig.config_bytes(): 2, dtype id
             geometry         varints   layers, kv_heads, head_dim
             tokens           varint    positions in the entry
    payload  bytes                      lossy: WarmCodec's stored fields, their length fixed by
                                        the above; exact: ExactCodec's digest and byte planes

Version 1 had no exact coding (its config byte was 0 or 1); its entries are read as before, and
an older seqkv refuses a version-2 entry by its version (``UnsupportedVersionError``).

Invariants:
1. ``read_entry`` checks, in order: the envelope (magic, version, lengths, CRC-32:
   ``CorruptFileError`` and its siblings), every header field's range, the model digest
   (``ModelMismatchError``), the tag when the caller names one (``WarmTagMismatchError``), then
   the payload's length against the config (``CorruptFileError``) (enforced; a test each).
   The codec then checks the payload's fields; an exact payload, its values' digest.
2. Every byte of an entry is counted in its size: ``len(write_entry(...))`` is what a store
   keeps (enforced by construction).
3. The checksum detects damage, not forgery; a crafted lossy entry with a valid CRC can only
   decode to finite KV of the stated geometry (``WarmCodec`` refuses non-finite values), and a
   crafted exact entry only to the values its digest names (assumed: the digest is a truncated
   SHA-256, not a seal).
"""

from __future__ import annotations

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
from seqkv.quantizers.bitpack import MAX_BITS
from seqkv.types import KVGeometry
from seqkv.warm.config import (
    EXACT_CODING,
    EXACT_DTYPES,
    QUANTIZER_IDS,
    EntryConfig,
    ExactConfig,
    WarmConfig,
    WarmModel,
    predictor_from_ids,
)

MAGIC = b"\x89SKW"
VERSION = 2
READ_VERSIONS = frozenset({1, VERSION})
_ERRORS = FramingErrors(CorruptFileError, NotASeqKVFileError, UnsupportedVersionError,
                        TruncatedFileError, CorruptFileError)
_WHAT = "the warm entry"


@dataclass(frozen=True)
class EntryHeader:
    model: Digest
    tag: Digest | None
    config: EntryConfig
    geometry: KVGeometry
    num_tokens: int


def header_bytes(header: EntryHeader) -> bytes:
    g = header.geometry
    tag = b"" if header.tag is None else bytes(header.tag)
    return b"".join([bytes(header.model), bytes([0 if header.tag is None else 1]), tag,
                     header.config.config_bytes(), encode_varint(g.layers),
                     encode_varint(g.kv_heads), encode_varint(g.head_dim),
                     encode_varint(header.num_tokens)])


def write_entry(header: EntryHeader, payload: bytes) -> bytes:
    """The framed entry (every byte a store keeps)."""
    return frame(MAGIC, VERSION, [header_bytes(header), payload])


def _read_header(data: bytes, version: int) -> EntryHeader:
    reader = SectionReader(data, "the warm entry's header", CorruptFileError)
    model = Digest(reader.take(DIGEST_BYTES, "model digest"))
    flags = reader.u8("flags")
    if flags > 1:
        raise reader.fail(f"has unknown flags {flags:#x}")
    tag = Digest(reader.take(DIGEST_BYTES, "tag")) if flags else None
    kind = reader.u8("coding")
    if kind == EXACT_CODING and version >= 2:
        dtype = reader.u8("dtype")
        if dtype >= len(EXACT_DTYPES):
            raise reader.fail(f"names unknown dtype {dtype}")
        return EntryHeader(model, tag, ExactConfig(EXACT_DTYPES[dtype]),
                           *_read_shape(reader))
    if kind > 1:
        raise reader.fail(f"names unknown coding {kind} (version {version})")
    group = reader.varint("group size", 1, MAX_WARM_TOKENS) if kind else 1
    reference = reader.u8("reference") if kind else 0
    if reference > 1:
        raise reader.fail(f"names unknown reference {reference}")
    quantizer = reader.u8("quantizer")
    if quantizer >= len(QUANTIZER_IDS):
        raise reader.fail(f"names unknown quantizer {quantizer}")
    bits = reader.u8("bits")
    seed = reader.varint("seed")
    geometry, tokens = _read_shape(reader)
    if bits > MAX_BITS and QUANTIZER_IDS[quantizer] not in ("int8", "fp8"):
        raise reader.fail(f"has bits {bits} beyond {MAX_BITS}")
    try:
        config = WarmConfig(predictor_from_ids(kind, group, reference), QUANTIZER_IDS[quantizer],
                            bits, seed)
    except ValueError as error:
        raise reader.fail(f"names a config this seqkv cannot code: {error}") from None
    return EntryHeader(model, tag, config, geometry, tokens)


def _read_shape(reader: SectionReader) -> tuple[KVGeometry, int]:
    """The header's last fields: geometry and token count (then nothing)."""
    layers = reader.varint("layers", 1, MAX_WARM_GEOMETRY)
    heads = reader.varint("kv heads", 1, MAX_WARM_GEOMETRY)
    head_dim = reader.varint("head dim", 2, MAX_WARM_GEOMETRY)
    tokens = reader.varint("token count", 1, MAX_WARM_TOKENS)
    reader.finish()
    return KVGeometry(layers, heads, head_dim), tokens


def read_entry(data: bytes, model: WarmModel, tag: Digest | None = None
               ) -> tuple[EntryHeader, bytes]:
    """The header and payload of an entry for ``model`` (and ``tag``, when given), checked."""
    version, sections = unframe(data, MAGIC, READ_VERSIONS, _ERRORS, _WHAT)
    if len(sections) != 2:
        raise CorruptFileError(f"{_WHAT} has {len(sections)} sections, not 2: it is damaged")
    header = _read_header(sections[0], version)
    if header.model != model.digest or header.geometry != model.geometry:
        raise ModelMismatchError(
            f"{_WHAT} holds KV of model {hex_digest(header.model)} ({header.geometry}); this is "
            f"model {hex_digest(model.digest)} ({model.geometry}): load it with the model that "
            "produced it, or recompute"
        )
    if tag is not None and header.tag != tag:
        got = "no tag" if header.tag is None else f"tag {hex_digest(header.tag)}"
        raise WarmTagMismatchError(
            f"{_WHAT} has {got}, not {hex_digest(tag)}: it stands for other tokens (a misfiled "
            "or stale entry); recompute the KV"
        )
    return header, sections[1]

"""The .skv container: a compact binary header, the token code, the KV residual code.

Format 4 (written since this version) frames three sections with ``seqkv.framing`` (4-byte magic
``\\x89SKV``, version byte, section lengths, CRC-32)::

    header    flags            u8      bit 0 prefix, bit 1 residual, bit 2 vocabulary size
                                       stored, bit 3 dictionary, bit 4 no KV digest (format 4),
                                       bits 5-7 unused bits at the token code's end
              level            u8      ``LEVEL_IDS``; then a varint parameter (segments N, else 0)
              count            varint  tokens coded (after the prefix)
              [vocab size]     varint  only for levels that decode without the model
              model digest     8 bytes ``seqkv.digests.model_digest``: config, weights, tokenizer
              profile digest   8 bytes ``seqkv.digests.profile_digest`` of the execution profile
              tokens digest    8 bytes SHA-256 of all tokens (prefix included), truncated
              [KV digest]      8 bytes SHA-256 of the KV the decoder must end with, truncated;
                                       absent when bit 4 says the encoder computed no KV (a
                                       portable level coded without the caller's KV: tokens
                                       only, no residual either)
              [prefix]         32-byte content hash, varint token count, 8-byte KV digest
              [dictionary]     32-byte digest of the mixing dictionary (bit 3 of the flags)
    token code                 the arithmetic code's bytes
    residual  mode             u8      0 quantized at a tolerance, 1 bit-exact
              [tolerance]      f64     (quantized)
              groups           varint  (layer, K/V) groups; then a bitmap of the used ones
              scales           f32     one per used group
              escapes          varint  escaped components; then the range coder's words, then
                                       the escaped float32 values

The full model identity and execution profile are not in the file: they are named by digest and
kept once where they are needed (``seqkv.descriptions``; a store keeps its own), so a session of
586 tokens costs 400 bytes instead of 1,783. Format 3 is format 4 without bit 4: its files
still read, and are written back as format 3. Files of formats 1 and 2 (a JSON header,
``seqkv.container_legacy``) still read, and ``seqkv upgrade`` rewrites them in format 4 without
re-coding.

Invariants:
1. ``decode_container`` checks emptiness, magic, version, lengths and checksum before it parses
   anything (``seqkv.framing``), so each kind of damage gets its own error: EmptyInputError,
   NotASeqKVFileError, UnsupportedVersionError, TruncatedFileError, CorruptFileError (enforced;
   one test each). A header that passes the checksum but does not parse is CorruptFileError.
2. ``decode_container(encode_container(c)) == c`` for a format-3 or 4 container, and
   ``encode_container(decode_container(d)) == d`` for any bytes ``d`` it accepts: every field is
   read in the one form the encoder writes (minimal varints, zero padding bits, no bitmap bits
   past the groups, no zero scale marked used), so no two files decode alike (enforced; checked
   by the fuzz suite).
3. Every header and residual field is validated while it is read, against the format's own
   ranges (``MAX_POSITIONS``, ``MAX_SEGMENTS``, ``MAX_VOCAB``, ``MAX_GROUPS``, the residual's
   ``ResidualCode.check``), before anything is allocated by its size: a crafted file with a valid
   checksum still ends in CorruptFileError (enforced; ``tests/test_fuzz_skv.py``). What depends
   on the model (its context, vocabulary, layer count) the decoder checks (``seqkv.codec``).
4. This module imports neither torch nor transformers (enforced by ``tests/test_layering.py``).
5. ``write_container_file`` replaces an existing file whole or not at all (enforced).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

from seqkv.coding.arithmetic import BitStream
from seqkv.coding.frequencies import MAX_VOCAB
from seqkv.coding.residual_code import ResidualCode, ResidualMode
from seqkv.container_legacy import LEGACY_MAGIC, LegacyFile, read_legacy
from seqkv.digests import DIGEST_BYTES, Digest, model_digest, profile_digest
from seqkv.errors import (
    CorruptFileError,
    EmptyInputError,
    NotASeqKVFileError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from seqkv.files import write_atomically
from seqkv.framing import (
    FramingErrors,
    SectionReader,
    encode_varint,
    frame,
    framing_overhead,
    unframe,
)
from seqkv.types import ExecutionProfile, ModelIdentity

MAGIC = b"\x89SKV"
FORMAT_VERSION = 4
# Format 3 is format 4 without the flag of a file that records no KV digest (bit 4).
FRAMED_VERSIONS = (3, 4)
READABLE_VERSIONS = (1, 2, 3, 4)
# The file's level ids: an id is never reused; a new level appends its family name here.
# NOTE: append only: a file records its level as the index here.
LEVEL_IDS: tuple[str, ...] = ("tokens", "rows", "segments", "ngram", "plain", "portable",
                               "portable+mix", "portable4")
# NOTE: ``seqkv.levels.segments.MAX_SEGMENTS``, repeated here because this module imports no
# torch (a test keeps the two equal).
MAX_SEGMENTS = 64
# The parameter each level family may carry (segments N; portable's layer count, 0 = all), and
# the levels that decode without the model and so record the vocabulary size
# (``tests/test_container.py`` checks both against ``seqkv.levels``).
_LEVEL_PARAMETERS: dict[str, tuple[int, int]] = {"segments": (2, MAX_SEGMENTS),
                                                 "portable": (0, 1024), "portable4": (0, 1024)}
VOCAB_STORED_LEVELS = frozenset({"ngram", "plain"})
# NOTE: 2**31 positions: more than any model's context, so a count beyond it is corruption
# without asking the model; the decoder then bounds it by the model's own context.
MAX_POSITIONS = 1 << 31
# NOTE: a (layer, K/V) group each: 1,024 layers, beyond any model seqkv runs (SmolLM2: 30).
MAX_GROUPS = 2 * 1024
PREFIX_HASH_BYTES = 32
_ERRORS = FramingErrors(EmptyInputError, NotASeqKVFileError, UnsupportedVersionError,
                        TruncatedFileError, CorruptFileError)
_WHAT = "the .skv file"
_FLAG_PREFIX, _FLAG_RESIDUAL, _FLAG_VOCAB, _FLAG_DICTIONARY, _FLAG_NO_KV = 1, 2, 4, 8, 0b10000
DICTIONARY_DIGEST_BYTES = 32


@dataclass(frozen=True)
class PrefixRef:
    """The shared prefix (in a ``seqkv.trie.PrefixTrie`` or a store) the token code continues."""

    prefix_hash: str  # 64 hex digits: the prefix's content hash
    tokens: int
    kv_digest: Digest  # of the prefix's stored KV


@dataclass(frozen=True)
class Legacy:
    """What only a format-1 or 2 file says about itself (its full descriptions)."""

    writer: str
    model: ModelIdentity
    profile: ExecutionProfile
    first_token_context: int | None
    kv_shape: tuple[int, ...]


@dataclass(frozen=True)
class Header:
    format_version: int
    level: str  # the level's name: "tokens", "segments:4", ...
    count: int  # tokens coded (after the prefix)
    segments: tuple[int, ...]  # segment lengths, in coding order
    vocab_size: int | None  # stored for levels that decode without the model
    model_digest: Digest
    profile_digest: Digest
    tokens_digest: Digest
    # The KV the decoder must end with; None where the encoder computed no KV (format 4 only).
    kv_digest: Digest | None
    prefix: PrefixRef | None
    legacy: Legacy | None = None  # set for files of formats 1 and 2
    # The mixing dictionary the token code was coded with (64 hex digits), if any.
    dictionary: str | None = None


@dataclass(frozen=True)
class Container:
    """A parsed .skv file."""

    header: Header
    token_code: BitStream
    residual: ResidualCode | None


def split_lengths(count: int, segments: int) -> list[int]:
    """``count`` tokens in ``segments`` consecutive parts, the first ones longer by at most 1."""
    segments = max(1, min(segments, count))
    base, extra = divmod(count, segments)
    return [base + (1 if j < extra else 0) for j in range(segments)]


def _level_parts(level: str) -> tuple[int, int]:
    name, _, count = level.partition(":")
    if name not in LEVEL_IDS:
        raise ValueError(f"level {level!r} has no file id")
    return LEVEL_IDS.index(name), int(count) if count else 0


def encode_container(container: Container) -> bytes:
    return encode_container_with_sections(container)[0]


def encode_container_with_sections(container: Container) -> tuple[bytes, dict[str, int]]:
    """The file's bytes (in the header's format, 3 or 4) and the size of each of its parts, in
    file order."""
    header = container.header
    # a format-1 or 2 file's container is written in the current format
    version = FORMAT_VERSION if header.legacy is not None else header.format_version
    if version not in FRAMED_VERSIONS:
        raise ValueError(f"format {version} is not written; {FRAMED_VERSIONS} are")
    if header.kv_digest is None and (version < 4 or container.residual is not None
                                     or not header.level.startswith("portable")):
        raise ValueError("a file without a KV digest is format 4, of a portable level, and "
                         "holds no residual")
    code = container.token_code
    padding = 8 * len(code.data) - code.num_bits
    flags = ((_FLAG_PREFIX if header.prefix is not None else 0)
             | (_FLAG_RESIDUAL if container.residual is not None else 0)
             | (_FLAG_VOCAB if header.vocab_size is not None else 0)
             | (_FLAG_DICTIONARY if header.dictionary is not None else 0)
             | (_FLAG_NO_KV if header.kv_digest is None else 0) | padding << 5)
    level_id, parameter = _level_parts(header.level)
    fields = [bytes([flags, level_id]), encode_varint(parameter), encode_varint(header.count)]
    if header.vocab_size is not None:
        fields.append(encode_varint(header.vocab_size))
    fields += [header.model_digest, header.profile_digest, header.tokens_digest]
    if header.kv_digest is not None:
        fields.append(header.kv_digest)
    if header.prefix is not None:
        fields += [bytes.fromhex(header.prefix.prefix_hash), encode_varint(header.prefix.tokens),
                   header.prefix.kv_digest]
    if header.dictionary is not None:
        fields.append(bytes.fromhex(header.dictionary))
    sections = [b"".join(fields), code.data]
    if container.residual is not None:
        sections.append(encode_residual_section(container.residual))
    data = frame(MAGIC, version, sections)
    parts = {"framing": framing_overhead(sections), "header": len(sections[0]),
             "token_code": len(code.data),
             "residual_code": len(sections[2]) if len(sections) > 2 else 0}
    return data, parts


def encode_residual_section(residual: ResidualCode) -> bytes:
    """The residual's bytes as a file's third section holds them (see the module docstring)."""
    used = [i for i, scale in enumerate(residual.scales) if scale != 0.0]
    bitmap = bytearray((len(residual.scales) + 7) // 8)
    for index in used:
        bitmap[index // 8] |= 1 << (index % 8)
    quantized = residual.mode is ResidualMode.QUANTIZED
    return b"".join([
        bytes([0 if quantized else 1]),
        struct.pack("<d", residual.tolerance) if quantized else b"",
        encode_varint(len(residual.scales)), bytes(bitmap),
        b"".join(struct.pack("<f", residual.scales[i]) for i in used),
        encode_varint(len(residual.escapes) // 4), residual.words, residual.escapes,
    ])


def decode_container(data: bytes) -> Container:
    """Parse .skv bytes of any readable format (see the module invariants)."""
    if len(data) >= len(LEGACY_MAGIC) and data[: len(LEGACY_MAGIC)] == LEGACY_MAGIC:
        return _from_legacy(read_legacy(data))
    version, sections = unframe(data, MAGIC, FRAMED_VERSIONS, _ERRORS, _WHAT, READABLE_VERSIONS)
    if len(sections) not in (2, 3):
        raise CorruptFileError(f"the .skv file has {len(sections)} sections, not 2 or 3")
    header, flags = _decode_header(sections[0], version)
    token_code = _token_code(sections[1], flags >> 5)
    has_residual = bool(flags & _FLAG_RESIDUAL)
    if has_residual != (len(sections) == 3):
        raise CorruptFileError("the .skv file's residual flag and sections disagree")
    if has_residual and header.kv_digest is None:
        raise CorruptFileError("the .skv file holds a KV residual but records no KV digest")
    residual = decode_residual_section(sections[2]) if has_residual else None
    return Container(header, token_code, residual)


def _token_code(data: bytes, padding: int) -> BitStream:
    """The token code, whose last byte's ``padding`` unused bits must be zeros."""
    if padding and not data:
        raise CorruptFileError("the .skv token code is empty but declares unused bits")
    if data and data[-1] & ((1 << padding) - 1):
        raise CorruptFileError("the .skv token code's unused bits are not zeros")
    return BitStream(data, 8 * len(data) - padding)


def _decode_header(section: bytes, version: int) -> tuple[Header, int]:
    reader = SectionReader(section, "the .skv header", CorruptFileError)
    flags = reader.u8("flags")
    level_id = reader.u8("level id")
    if flags & _FLAG_NO_KV and version < 4:
        raise CorruptFileError(f"the .skv header has unknown flags {_FLAG_NO_KV:#x} for format "
                               f"{version}")
    if level_id >= len(LEVEL_IDS):
        raise CorruptFileError(f"the .skv header has unknown level id {level_id}: use the "
                               "seqkv release that wrote it")
    family = LEVEL_IDS[level_id]
    low, high = _LEVEL_PARAMETERS.get(family, (0, 0))
    parameter = reader.varint(f"{family} parameter", low, high)
    count = reader.varint("token count", 1, MAX_POSITIONS)
    if bool(flags & _FLAG_VOCAB) != (family in VOCAB_STORED_LEVELS):
        raise CorruptFileError(f"the .skv header {'stores' if flags & _FLAG_VOCAB else 'lacks'} "
                               f"a vocabulary size, which the {family} level "
                               f"{'does not' if flags & _FLAG_VOCAB else 'does'} record")
    vocab = reader.varint("vocabulary size", 1, MAX_VOCAB) if flags & _FLAG_VOCAB else None
    model, profile, tokens = (Digest(reader.take(DIGEST_BYTES, name))
                              for name in ("model digest", "profile digest", "tokens digest"))
    kv = None if flags & _FLAG_NO_KV else Digest(reader.take(DIGEST_BYTES, "KV digest"))
    if kv is None and not family.startswith("portable"):
        raise CorruptFileError(f"the .skv header records no KV digest, which only a portable "
                               f"level may omit, not {family}")
    prefix = None
    if flags & _FLAG_PREFIX:
        prefix_hash = reader.take(PREFIX_HASH_BYTES, "prefix hash").hex()
        prefix_tokens = reader.varint("prefix token count", 1, MAX_POSITIONS - count)
        prefix = PrefixRef(prefix_hash, prefix_tokens,
                           Digest(reader.take(DIGEST_BYTES, "prefix KV digest")))
    dictionary = None
    if flags & _FLAG_DICTIONARY:
        dictionary = reader.take(DICTIONARY_DIGEST_BYTES, "dictionary digest").hex()
    reader.finish()
    level = f"{family}:{parameter}" if parameter else family
    # Only the segments level splits its tokens; another level's parameter is no count.
    segments = tuple(split_lengths(count, parameter)) if family == "segments" else (count,)
    header = Header(format_version=version, level=level, count=count, segments=segments,
                    vocab_size=vocab, model_digest=model, profile_digest=profile,
                    tokens_digest=tokens, kv_digest=kv, prefix=prefix, dictionary=dictionary)
    return header, flags


def decode_residual_section(section: bytes) -> ResidualCode:
    """The residual a third section holds, checked (``ResidualCode.check``); its shape is set by
    the decoder (``with_shape``)."""
    reader = SectionReader(section, "the .skv residual", CorruptFileError)
    mode_byte = reader.u8("mode")
    if mode_byte not in (0, 1):
        raise CorruptFileError(f"the .skv residual has unknown mode {mode_byte}")
    mode = ResidualMode.QUANTIZED if mode_byte == 0 else ResidualMode.BIT_EXACT
    tolerance = reader.f64("tolerance") if mode_byte == 0 else 0.0
    groups = reader.varint("group count", 2, MAX_GROUPS)
    if groups % 2:
        raise CorruptFileError(f"the .skv residual has {groups} groups: not a key and a value "
                               "group per layer")
    bitmap = reader.take((groups + 7) // 8, "group bitmap")
    if groups % 8 and bitmap[-1] >> (groups % 8):
        raise CorruptFileError("the .skv residual's group bitmap sets bits past its groups")
    used = [i for i in range(groups) if bitmap[i // 8] >> (i % 8) & 1]
    raw = reader.take(4 * len(used), "scales")
    values = dict(zip(used, struct.unpack(f"<{len(used)}f", raw), strict=True))
    scales = tuple(float(values.get(i, 0.0)) for i in range(groups))
    if any(values[i] == 0.0 for i in used):
        raise CorruptFileError("the .skv residual marks a group used whose scale is 0")
    escapes = reader.varint("escape count")
    rest = reader.rest()
    if 4 * escapes > len(rest):
        raise CorruptFileError("the .skv residual declares more escapes than it holds")
    split = len(rest) - 4 * escapes
    code = ResidualCode(mode, tolerance, (), scales, rest[:split], rest[split:]).check()
    if not all(math.isfinite(value) for (value,) in struct.iter_unpack("<f", code.escapes)):
        raise CorruptFileError("the .skv residual escapes a value that is not finite")
    return code


def _from_legacy(file: LegacyFile) -> Container:
    """A format-1 or 2 file as a container (its full descriptions kept in ``legacy``; the reader
    has checked every field, ``seqkv.container_legacy``)."""
    parameter = len(file.segments) if file.level == "segments" else 0
    level = f"segments:{parameter}" if parameter else file.level
    prefix = None
    if file.prefix_hash is not None:
        prefix = PrefixRef(file.prefix_hash, file.prefix_tokens,
                           Digest(bytes.fromhex(file.prefix_kv_sha256)[:DIGEST_BYTES]))
    tokens_digest = Digest(bytes.fromhex(file.tokens_sha256)[:DIGEST_BYTES])
    kv_digest = Digest(bytes.fromhex(file.kv_sha256)[:DIGEST_BYTES])
    header = Header(
        format_version=file.version, level=level, count=file.count, segments=file.segments,
        vocab_size=file.vocab_size, model_digest=model_digest(file.model),
        profile_digest=profile_digest(file.profile), tokens_digest=tokens_digest,
        kv_digest=kv_digest, prefix=prefix,
        legacy=Legacy(file.writer, file.model, file.profile, file.first_token_context,
                      file.kv_shape),
    )
    return Container(header, file.token_code, file.residual)


def write_container_file(path: str | Path, data: bytes) -> None:
    """Write .skv bytes to ``path`` atomically (see ``seqkv.files.write_atomically``)."""
    write_atomically(path, data)

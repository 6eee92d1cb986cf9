"""The .skv file: a ``CodedSession`` as a compact binary header, the token code, the residual.

Format 5 (the format written) is format 4 whose token code is exactly the bits
``ArithmeticEncoder.finish`` writes, floor included (``seqkv.coding.arithmetic`` invariant 2):
its decoder stops a stream once the information decoded exceeds what the code carries (a forged
token count costs at most ``OVERRUN_BITS`` of decoding past the code's end) and refuses a code
with bits its writer would not write. The layout is format 4's. Format 4 frames three sections
with ``seqkv.formats.framing`` (magic ``\\x89SKV``, version byte, section lengths, CRC-32)::

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
still read, and are written back as format 3. Files of formats 3 and 4 read as their writers
wrote them (every trailing zero of the token code dropped; ``CodedSession.code_form``
``trimmed``) and are written back in their own format; a session whose code has no writer's
promise (whole bytes: a store span record of version 1 or 2) is written as format 4, its
trailing zero bits dropped.
Files of formats 1 and 2 (a JSON header, ``seqkv.formats.skv_legacy``) read into the same value,
and ``seqkv upgrade`` rewrites them in format 4 without re-coding.

Invariants:
1. ``read_skv`` checks emptiness, magic, version, lengths and checksum before it parses
   anything (``seqkv.formats.framing``), so each kind of damage gets its own error: EmptyInputError,
   NotASeqKVFileError, UnsupportedVersionError, TruncatedFileError, CorruptFileError (enforced;
   one test each). A header that passes the checksum but does not parse is CorruptFileError.
2. ``read_skv(write_skv(s)).session == s`` for a session of format 3, 4 or 5, and
   ``write_skv(read_skv(d), v) == d`` for any bytes ``d`` of format ``v`` it accepts: every
   field is read in the one form the encoder writes (minimal varints, zero padding bits, no
   bitmap bits past the groups, no zero scale marked used), and the decoder checks that the
   token code is the one its writer writes for the tokens it decodes to (``seqkv.coding.arithmetic``
   invariant 6) and, in format 5, that the residual's scales and coder words are the ones its
   encoder writes for the symbols they decode to (``seqkv.coding.residual`` invariant 3), so no
   two files decode alike, but for the quantized residual's tolerance, which the file states as
   its encoder's promise (reported, not used, when no group is coded and nothing escapes)
   (enforced; checked by the fuzz suites, ``tests/test_fuzz_bounds.py``).
3. Every header and residual field is validated while it is read, against the format's own
   ranges (``seqkv.limits``, the residual's ``ResidualCode.check``), before anything is
   allocated by its size: a crafted file with a valid
   checksum still ends in CorruptFileError (enforced; ``tests/test_fuzz_skv.py``). What depends
   on the model (its context, vocabulary, layer count) the decoder checks (``seqkv.codec``).
4. This module imports neither torch nor transformers (enforced by ``tests/test_layering.py``).
5. ``write_skv_file`` replaces an existing file whole or not at all (enforced).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from seqkv.coding.arithmetic import BitStream
from seqkv.digests import DIGEST_BYTES, Digest
from seqkv.errors import (
    CorruptFileError,
    EmptyInputError,
    NotASeqKVFileError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from seqkv.files import write_atomically
from seqkv.formats.framing import (
    FramingErrors,
    SectionReader,
    encode_varint,
    frame,
    framing_overhead,
    unframe,
)
from seqkv.formats.residual import (
    DICTIONARY_DIGEST_BYTES,
    decode_residual_section,
    encode_residual_section,
)
from seqkv.formats.skv_legacy import LEGACY_MAGIC, ReaderSide, read_legacy, upgraded
from seqkv.limits import MAX_LAYERS, MAX_POSITIONS, MAX_SEGMENTS, MAX_VOCAB
from seqkv.session import CodedSession, CodeForm, PrefixRef, split_lengths
from seqkv.types import ExecutionProfile, ModelIdentity

MAGIC = b"\x89SKV"
FORMAT_VERSION = 5
# Format 3 is format 4 without the flag of a file that records no KV digest (bit 4); format 5 is
# format 4 with the floored token code (the module docstring).
FRAMED_VERSIONS = (3, 4, 5)
READABLE_VERSIONS = (1, 2, 3, 4, 5)
# The token code each framed version holds (``seqkv.session`` invariant 4).
_CODE_FORMS: dict[int, CodeForm] = {3: "trimmed", 4: "trimmed", 5: "floored"}
# The file's level ids: an id is never reused; a new level appends its family name here.
# NOTE: append only: a file records its level as the index here.
LEVEL_IDS: tuple[str, ...] = ("tokens", "rows", "segments", "ngram", "plain", "portable",
                               "portable+mix", "portable4")
# The parameter each level family may carry (segments N; portable's layer count, 0 = all), and
# the levels that decode without the model and so record the vocabulary size
# (``tests/test_container.py`` checks both against ``seqkv.levels``).
_LEVEL_PARAMETERS: dict[str, tuple[int, int]] = {"segments": (2, MAX_SEGMENTS),
                                                 "portable": (0, MAX_LAYERS),
                                                 "portable4": (0, MAX_LAYERS)}
VOCAB_STORED_LEVELS = frozenset({"ngram", "plain"})
PREFIX_HASH_BYTES = 32
_ERRORS = FramingErrors(EmptyInputError, NotASeqKVFileError, UnsupportedVersionError,
                        TruncatedFileError, CorruptFileError)
_WHAT = "the .skv file"
_FLAG_PREFIX, _FLAG_RESIDUAL, _FLAG_VOCAB, _FLAG_DICTIONARY, _FLAG_NO_KV = 1, 2, 4, 8, 0b10000


@dataclass(frozen=True)
class SkvRead:
    """A .skv file read: the coded session, the format it was written in, and the full model
    and profile descriptions the file carried (formats 1 and 2 only)."""

    session: CodedSession
    version: int
    writer: str | None = None
    model: ModelIdentity | None = None
    profile: ExecutionProfile | None = None


@dataclass(frozen=True)
class SkvBytes:
    """A written .skv file and the size of each of its parts, in file order."""

    data: bytes
    sections: dict[str, int]


def _level_parts(level: str) -> tuple[int, int]:
    name, _, count = level.partition(":")
    if name not in LEVEL_IDS:
        raise ValueError(f"level {level!r} has no file id")
    return LEVEL_IDS.index(name), int(count) if count else 0


def write_skv(session: CodedSession, version: int | None = None) -> SkvBytes:
    """The file of ``session`` in format ``version`` (3, 4 or 5; default: 5 for a floored token
    code, else 4). Format 5 holds only a floored code; formats 3 and 4 hold the code as their
    writers wrote it, every trailing zero bit dropped (``seqkv.session`` invariant 4)."""
    if version is None:
        version = FORMAT_VERSION if session.code_form == "floored" else 4
    if version not in FRAMED_VERSIONS:
        raise ValueError(f"format {version} is not written; {FRAMED_VERSIONS} are")
    if version == FORMAT_VERSION and session.code_form != "floored":
        raise ValueError(f"format {version} holds a floored token code, not one of form "
                         f"{session.code_form!r}")
    if version < FORMAT_VERSION and session.code_form != "trimmed":
        session = replace(session, token_code=_without_trailing_zeros(session.token_code),
                          code_form="trimmed")
    if session.kv_scope != "all":
        raise ValueError("a .skv file's KV digest covers the whole KV")
    if session.kv_digest is None and (version < 4 or session.residual is not None
                                      or not session.level.startswith("portable")):
        raise ValueError("a file without a KV digest is format 4, of a portable level, and "
                         "holds no residual")
    code = session.token_code
    padding = 8 * len(code.data) - code.num_bits
    flags = ((_FLAG_PREFIX if session.prefix is not None else 0)
             | (_FLAG_RESIDUAL if session.residual is not None else 0)
             | (_FLAG_VOCAB if session.vocab_size is not None else 0)
             | (_FLAG_DICTIONARY if session.dictionary is not None else 0)
             | (_FLAG_NO_KV if session.kv_digest is None else 0) | padding << 5)
    level_id, parameter = _level_parts(session.level)
    fields = [bytes([flags, level_id]), encode_varint(parameter), encode_varint(session.count)]
    if session.vocab_size is not None:
        fields.append(encode_varint(session.vocab_size))
    fields += [session.model_digest, session.profile_digest, session.tokens_digest]
    if session.kv_digest is not None:
        fields.append(session.kv_digest)
    if session.prefix is not None:
        fields += [bytes.fromhex(session.prefix.prefix_hash),
                   encode_varint(session.prefix.tokens), session.prefix.kv_digest]
    if session.dictionary is not None:
        fields.append(bytes.fromhex(session.dictionary))
    sections = [b"".join(fields), code.data]
    if session.residual is not None:
        sections.append(encode_residual_section(session.residual))
    data = frame(MAGIC, version, sections)
    parts = {"framing": framing_overhead(sections), "header": len(sections[0]),
             "token_code": len(code.data),
             "residual_code": len(sections[2]) if len(sections) > 2 else 0}
    return SkvBytes(data, parts)


def read_skv(data: bytes, side: ReaderSide | None = None) -> SkvRead:
    """Parse .skv bytes of any readable format (see the module invariants); a file of format 1
    or 2 is upgraded on read, checked against what ``side`` knows of the reader
    (``seqkv.formats.skv_legacy.upgraded``)."""
    if len(data) >= len(LEGACY_MAGIC) and data[: len(LEGACY_MAGIC)] == LEGACY_MAGIC:
        legacy = upgraded(read_legacy(data), side or ReaderSide())
        return SkvRead(legacy.session, legacy.version, legacy.writer, legacy.model,
                       legacy.profile)
    version, sections = unframe(data, MAGIC, FRAMED_VERSIONS, _ERRORS, _WHAT, READABLE_VERSIONS)
    if len(sections) not in (2, 3):
        raise CorruptFileError(f"the .skv file has {len(sections)} sections, not 2 or 3")
    fields, flags = _decode_header(sections[0], version)
    token_code = _token_code(sections[1], flags >> 5)
    has_residual = bool(flags & _FLAG_RESIDUAL)
    if has_residual != (len(sections) == 3):
        raise CorruptFileError("the .skv file's residual flag and sections disagree")
    if has_residual and fields.kv_digest is None:
        raise CorruptFileError("the .skv file holds a KV residual but records no KV digest")
    residual = decode_residual_section(sections[2]) if has_residual else None
    session = CodedSession(
        level=fields.level, count=fields.count, segments=fields.segments,
        vocab_size=fields.vocab_size, model_digest=fields.model_digest,
        profile_digest=fields.profile_digest, tokens_digest=fields.tokens_digest,
        kv_digest=fields.kv_digest, prefix=fields.prefix, dictionary=fields.dictionary,
        token_code=token_code, residual=residual, code_form=_CODE_FORMS[version])
    return SkvRead(session, version)


def _without_trailing_zeros(code: BitStream) -> BitStream:
    """``code`` without its trailing zero bits, which the decoder reads past its end anyway."""
    length = code.num_bits
    while length and not code.data[(length - 1) // 8] >> (7 - (length - 1) % 8) & 1:
        length -= 1
    return BitStream(code.data[: (length + 7) // 8], length)


def _token_code(data: bytes, padding: int) -> BitStream:
    """The token code, whose last byte's ``padding`` unused bits must be zeros."""
    if padding and not data:
        raise CorruptFileError("the .skv token code is empty but declares unused bits")
    if data and data[-1] & ((1 << padding) - 1):
        raise CorruptFileError("the .skv token code's unused bits are not zeros")
    return BitStream(data, 8 * len(data) - padding)


@dataclass(frozen=True)
class _HeaderFields:
    level: str
    count: int
    segments: tuple[int, ...]
    vocab_size: int | None
    model_digest: Digest
    profile_digest: Digest
    tokens_digest: Digest
    kv_digest: Digest | None
    prefix: PrefixRef | None
    dictionary: str | None


def _decode_header(section: bytes, version: int) -> tuple[_HeaderFields, int]:
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
    vocab = reader.varint("vocabulary size", 2, MAX_VOCAB) if flags & _FLAG_VOCAB else None
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
    fields = _HeaderFields(level=level, count=count, segments=segments, vocab_size=vocab,
                           model_digest=model, profile_digest=profile, tokens_digest=tokens,
                           kv_digest=kv, prefix=prefix, dictionary=dictionary)
    return fields, flags


def write_skv_file(path: str | Path, data: bytes) -> None:
    """Write .skv bytes to ``path`` atomically (see ``seqkv.files.write_atomically``)."""
    write_atomically(path, data)

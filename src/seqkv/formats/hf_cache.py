"""The Hugging Face cache file (``seqkv.store.hf.save_cache``): a ``DynamicCache``'s dtype and its
coded session in a small checksummed frame of its own. A sibling format of ``.skv`` and of the
store's span record, of the same value (``seqkv.session.CodedSession``), with no ``.skv`` inside.

Version 2 (the version written), integers as varints (``seqkv.formats.framing``)::

    magic      8 bytes  ``SKVCACHE``
    version    u8       2
    dtype      u8       the cache's dtype: an index into ``DTYPE_NAMES``
    flags      u8       bit 0 a residual follows, bit 1 a vocabulary size follows, bit 2 a KV
                        digest follows; bits 5-7 unused bits at the token code's end
    level      varint   length (1 to ``MAX_LEVEL_BYTES``), then the level's name in ASCII
                        (``seqkv.levels``; a name this seqkv does not know is refused by the
                        decoder, ``seqkv.codec.level_of``)
    segments   varint   how many (1 to ``MAX_SEGMENTS``), then each one's token count; the
                        session's token count is their sum
    [vocab]    varint   the vocabulary size, for a level that decodes without the model
    model      8 bytes  ``seqkv.digests.model_digest``
    profile    8 bytes  ``seqkv.digests.profile_digest`` of the execution profile
    tokens     8 bytes  digest of the tokens
    [KV]       8 bytes  digest of the KV the decoder must end with
    [residual] varint   length, then the residual as ``seqkv.formats.residual`` writes it
    code       bytes    the token code, exactly the bits ``ArithmeticEncoder.finish`` writes
                        (``code_form`` "floored")
    crc32      u32le    of everything before it (zlib.crc32)

Version 1 framed a whole ``.skv`` file after the dtype byte; it is read into the
same value through ``seqkv.formats.skv``, and written again only as version 2.

Invariants:
1. ``read_cache`` checks the magic, the version, the dtype code, then the CRC before it parses a
   field, and raises ``NotASeqKVFileError``, ``UnsupportedVersionError`` or
   ``CorruptFileError`` naming which failed (enforced; ``tests/test_store_hf.py``). Every field
   is checked against ``seqkv.limits`` before anything is allocated by its size (enforced).
2. ``read_cache(write_cache(d, s)) == CacheFile(d, s, 2)`` for every session it writes, and a
   version-2 file is read only in the form ``write_cache`` writes (minimal varints, zero padding
   bits, known flags) (checked by ``tests/test_store_hf.py``).
3. The session has no prefix and no mixing dictionary, records its KV digest, which covers the
   whole KV (``kv_scope`` "all"), and its token code is floored (enforced by the writer; a
   version-2 file without the digest, or a version-1 file whose ``.skv`` names a prefix or a
   dictionary, is ``CorruptFileError``: without the digest a load would return this machine's
   recompute unchecked).
4. This module imports neither torch nor transformers (enforced by ``tests/test_layering.py``).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from seqkv.coding.arithmetic import BitStream
from seqkv.digests import DIGEST_BYTES, Digest
from seqkv.errors import CorruptFileError, NotASeqKVFileError, UnsupportedVersionError
from seqkv.formats.framing import SectionReader, encode_varint
from seqkv.formats.residual import decode_residual_section, encode_residual_section
from seqkv.formats.skv import VOCAB_STORED_LEVELS, read_skv
from seqkv.formats.skv_legacy import ReaderSide
from seqkv.limits import MAX_LEVEL_BYTES, MAX_POSITIONS, MAX_SEGMENTS, MAX_VOCAB
from seqkv.session import CodedSession, split_lengths

CACHE_MAGIC = b"SKVCACHE"
CACHE_VERSION = 2
READABLE_CACHE_VERSIONS = (1, 2)
# NOTE: append only: a file records its cache's dtype as the index here.
DTYPE_NAMES: tuple[str, ...] = ("float32", "float16", "bfloat16")
_LEVEL_CHARACTERS = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789:+")
_PREFIX = struct.Struct("<8sBB")
_CRC = struct.Struct("<I")
_FLAG_RESIDUAL, _FLAG_VOCAB, _FLAG_KV = 1, 2, 4
_WHAT = "the cache file"


@dataclass(frozen=True)
class CacheFile:
    """A cache file read: its dtype (an index into ``DTYPE_NAMES``), its coded session and the
    version it was written in."""

    dtype: int
    session: CodedSession
    version: int


def write_cache(dtype: int, session: CodedSession) -> bytes:
    """The version-2 file of ``session``, a cache of dtype ``DTYPE_NAMES[dtype]`` (invariant 3
    says which sessions it holds; any other is ``ValueError``)."""
    if not 0 <= dtype < len(DTYPE_NAMES):
        raise ValueError(f"dtype code {dtype} names no dtype of {DTYPE_NAMES}")
    if session.prefix is not None or session.dictionary is not None:
        raise ValueError("a cache file's session has no prefix and no mixing dictionary")
    if session.kv_scope != "all" or session.code_form != "floored":
        raise ValueError("a cache file's session covers the whole KV with a floored token code")
    if session.kv_digest is None:
        raise ValueError("a cache file's session records the digest of its KV")
    level = session.level.encode("ascii")
    if not 1 <= len(level) <= MAX_LEVEL_BYTES or not set(level) <= _LEVEL_CHARACTERS:
        raise ValueError(f"level {session.level!r} is not a level name a cache file holds")
    code = session.token_code
    padding = 8 * len(code.data) - code.num_bits
    if not 0 <= padding < 8:
        raise ValueError("a token code's data holds whole unused bytes")
    flags = ((_FLAG_RESIDUAL if session.residual is not None else 0)
             | (_FLAG_VOCAB if session.vocab_size is not None else 0)
             | (_FLAG_KV if session.kv_digest is not None else 0) | padding << 5)
    out = bytearray(_PREFIX.pack(CACHE_MAGIC, CACHE_VERSION, dtype))
    out.append(flags)
    out += encode_varint(len(level)) + level
    out += encode_varint(len(session.segments))
    for length in session.segments:
        out += encode_varint(length)
    if session.vocab_size is not None:
        out += encode_varint(session.vocab_size)
    out += session.model_digest + session.profile_digest + session.tokens_digest
    if session.kv_digest is not None:
        out += session.kv_digest
    if session.residual is not None:
        residual = encode_residual_section(session.residual)
        out += encode_varint(len(residual)) + residual
    out += code.data
    out += _CRC.pack(zlib.crc32(out))
    return bytes(out)


def read_cache(data: bytes, side: ReaderSide | None = None) -> CacheFile:
    """A cache file of any readable version (see the module invariants); ``side``: what the
    reader knows of its model and machine, for the old ``.skv`` formats a version-1 file may
    frame (``seqkv.formats.skv.read_skv``)."""
    if len(data) < _PREFIX.size or data[: len(CACHE_MAGIC)] != CACHE_MAGIC:
        raise NotASeqKVFileError(
            f"{_WHAT} does not start with {CACHE_MAGIC!r}: it was not written by "
            "seqkv.store.hf.save_cache")
    _, version, dtype = _PREFIX.unpack_from(data)
    if version not in READABLE_CACHE_VERSIONS or dtype >= len(DTYPE_NAMES):
        raise UnsupportedVersionError(
            f"{_WHAT} has version {version} (dtype code {dtype}); this seqkv reads versions "
            f"{', '.join(map(str, READABLE_CACHE_VERSIONS))} of dtypes "
            f"{', '.join(DTYPE_NAMES)}: use the seqkv release that wrote it")
    if version == 1:
        session = read_skv(data[_PREFIX.size :], side).session
        if session.prefix is not None or session.dictionary is not None:
            raise CorruptFileError(f"{_WHAT}'s session names a prefix or a mixing dictionary, "
                                   "which save_cache never writes")
        return CacheFile(dtype, session, version)
    if len(data) < _PREFIX.size + 1 + _CRC.size:
        raise CorruptFileError(f"{_WHAT} of {len(data)} bytes is truncated")
    body = data[: -_CRC.size]
    if zlib.crc32(body) != _CRC.unpack_from(data, len(body))[0]:
        raise CorruptFileError(f"{_WHAT} fails its CRC32: its bytes were damaged")
    return CacheFile(dtype, _session(body[_PREFIX.size :]), version)


def _session(body: bytes) -> CodedSession:
    reader = SectionReader(body, _WHAT, CorruptFileError)
    flags = reader.u8("flags")
    if flags & 0b11000:
        raise reader.fail(f"has unknown flags {flags & 0b11000:#x}")
    level = reader.take(reader.varint("level length", 1, MAX_LEVEL_BYTES), "level")
    if not set(level) <= _LEVEL_CHARACTERS:
        raise reader.fail(f"names level {level!r}, which is no level name")
    segments = tuple(reader.varint("segment length", 1, MAX_POSITIONS)
                     for _ in range(reader.varint("segment count", 1, MAX_SEGMENTS)))
    if sum(segments) > MAX_POSITIONS:
        raise reader.fail(f"has {sum(segments):,} tokens, more than {MAX_POSITIONS:,}")
    # NOTE: one form per session, as the .skv header has it: only ``segments:N`` splits its
    # tokens (as ``split_lengths`` does), and only the model-free levels record a vocabulary
    family, _, parameter = level.decode("ascii").partition(":")
    parts = int(parameter) if family == "segments" and parameter.isdigit() else 1
    if not 1 <= parts <= MAX_SEGMENTS:
        raise reader.fail(f"names level {level.decode()!r}, beyond {MAX_SEGMENTS} segments")
    expected = tuple(split_lengths(sum(segments), parts))
    if segments != expected:
        raise reader.fail(f"splits its tokens {segments}, not as level {level.decode()!r} "
                          f"does {expected}")
    if bool(flags & _FLAG_VOCAB) != (family in VOCAB_STORED_LEVELS):
        raise reader.fail(f"{'stores' if flags & _FLAG_VOCAB else 'lacks'} a vocabulary size, "
                          f"which level {family!r} {'does not' if flags & _FLAG_VOCAB else 'does'}"
                          " record")
    vocab = reader.varint("vocabulary size", 2, MAX_VOCAB) if flags & _FLAG_VOCAB else None
    model, profile, tokens = (Digest(reader.take(DIGEST_BYTES, name))
                              for name in ("model digest", "profile digest", "tokens digest"))
    if not flags & _FLAG_KV:
        # a cache without its KV digest would load the machine's recompute unchecked
        raise reader.fail("records no KV digest, which save_cache always records")
    kv = Digest(reader.take(DIGEST_BYTES, "KV digest"))
    residual = None
    if flags & _FLAG_RESIDUAL:
        section = reader.take(reader.varint("residual length", 1, reader.remaining), "residual")
        residual = decode_residual_section(section)
    code = reader.rest()
    padding = flags >> 5
    if padding and not code:
        raise reader.fail("has an empty token code that declares unused bits")
    if code and code[-1] & ((1 << padding) - 1):
        raise reader.fail("has a token code whose unused bits are not zeros")
    return CodedSession(
        level=level.decode("ascii"), count=sum(segments), segments=segments, vocab_size=vocab,
        model_digest=model, profile_digest=profile, tokens_digest=tokens, kv_digest=kv,
        prefix=None, dictionary=None, token_code=BitStream(code, 8 * len(code) - padding),
        residual=residual, kv_scope="all", code_form="floored")

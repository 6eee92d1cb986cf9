"""The .skv container: a versioned header, the token code, the KV residual code, checksums.

Layout (all integers little-endian)::

    magic        8 bytes   b"\\x89SKV\\r\\n\\x1a\\n" (PNG-style: catches text-mode mangling)
    version      u16       FORMAT_VERSION
    reserved     u16       0
    header_len   u32       length of the JSON header
    section_len  3 x u64   token code, residual words, residual escapes
    header       JSON      ``Header``, UTF-8
    sections     bytes     in the order above
    sha256       32 bytes  of everything before it

Invariants:
1. ``read_container`` checks, in this order, magic, version, length and checksum before it parses
   the header, so each kind of damage gets its own error: NotASeqKVFileError,
   UnsupportedVersionError, TruncatedFileError, CorruptFileError (enforced; one test each).
2. ``write_container_file`` writes a temporary file beside the target and renames it, so an
   existing file is replaced whole or not at all (enforced).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seqkv.coding.arithmetic import BitStream
from seqkv.coding.residual import ResidualCode, ResidualMode
from seqkv.errors import (
    CorruptFileError,
    EmptyInputError,
    NotASeqKVFileError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from seqkv.files import write_atomically
from seqkv.types import ExecutionProfile, ModelIdentity

MAGIC = b"\x89SKV\r\n\x1a\n"
FORMAT_VERSION = 2
# Version 1 files (before coding levels) read as the ``tokens`` level in one segment.
READABLE_VERSIONS = (1, 2)
_PREFIX = struct.Struct("<8sHHIQQQ")
_DIGEST_BYTES = 32


@dataclass(frozen=True)
class TokenSection:
    """How the tokens were coded: their count, level, code length and checksum."""

    count: int
    num_bits: int
    first_token_context: int | None  # None: a uniform prior; unused after a shared prefix
    sha256: str
    level: str = "tokens"  # a ``seqkv.levels.Level`` value
    segments: list[int] | None = None  # segment lengths (rows/segments levels)
    vocab_size: int | None = None  # what the portable levels decode over, without a model


@dataclass(frozen=True)
class ResidualSection:
    """How the KV residual was coded (absent when no KV was given)."""

    mode: str
    tolerance: float
    scales: list[float]
    num_escapes: int
    max_abs_error: float


@dataclass(frozen=True)
class KVSection:
    """The KV the decoder must end with: its shape, dtype and checksum."""

    shape: list[int]
    dtype: str
    sha256: str
    residual: ResidualSection | None


@dataclass(frozen=True)
class PrefixSection:
    """The shared prefix (held in a ``seqkv.trie.PrefixTrie``) that the token code continues."""

    prefix_hash: str
    tokens: int
    kv_sha256: str


@dataclass(frozen=True)
class Header:
    format_version: int
    writer: str
    model: ModelIdentity
    profile: ExecutionProfile
    prefix: PrefixSection | None
    tokens: TokenSection
    kv: KVSection


@dataclass(frozen=True)
class Container:
    """A parsed .skv file."""

    header: Header
    token_code: BitStream
    residual: ResidualCode | None


def encode_container(container: Container) -> bytes:
    return encode_container_with_sections(container)[0]


def encode_container_with_sections(container: Container) -> tuple[bytes, dict[str, int]]:
    """The file's bytes and the size of each of its sections, in file order."""
    header = json.dumps(asdict(container.header), sort_keys=True).encode()
    residual = container.residual
    words = residual.words if residual is not None else b""
    escapes = residual.escapes if residual is not None else b""
    sections = {
        "framing": _PREFIX.size,
        "header": len(header),
        "token_code": len(container.token_code.data),
        "residual_code": len(words),
        "residual_escapes": len(escapes),
        "checksum": _DIGEST_BYTES,
    }
    body = b"".join([
        _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(header), len(container.token_code.data),
                     len(words), len(escapes)),
        header,
        container.token_code.data,
        words,
        escapes,
    ])
    return body + hashlib.sha256(body).digest(), sections


def decode_container(data: bytes) -> Container:
    if len(data) == 0:
        raise EmptyInputError("the .skv file is empty")
    if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
        raise NotASeqKVFileError("this is not a .skv file: its first bytes are not the magic")
    if len(data) < _PREFIX.size:
        raise TruncatedFileError(f"the .skv file ends after {len(data)} bytes, inside its prefix")
    _, version, _, header_len, token_len, words_len, escapes_len = _PREFIX.unpack_from(data)
    if version not in READABLE_VERSIONS:
        raise UnsupportedVersionError(
            f"the .skv file has format version {version}; this seqkv reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}: use the seqkv release that wrote it"
        )
    expected = _PREFIX.size + header_len + token_len + words_len + escapes_len + _DIGEST_BYTES
    if len(data) < expected:
        raise TruncatedFileError(
            f"the .skv file is truncated: it has {len(data)} bytes, its header says {expected}"
        )
    if len(data) > expected:
        raise CorruptFileError(
            f"the .skv file has {len(data) - expected} unexpected bytes after its end"
        )
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise CorruptFileError("the .skv file is corrupted: its SHA-256 checksum does not match")
    offset = _PREFIX.size
    header_bytes = body[offset : offset + header_len]
    offset += header_len
    token_data = body[offset : offset + token_len]
    offset += token_len
    words = body[offset : offset + words_len]
    escapes = body[offset + words_len :]
    try:
        header = _parse_header(json.loads(header_bytes), version)
        token_code = BitStream(token_data, header.tokens.num_bits)
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptFileError(f"the .skv header is malformed: {error}") from error
    residual = None
    if header.kv.residual is not None:
        section = header.kv.residual
        residual = ResidualCode(
            mode=ResidualMode(section.mode),
            tolerance=section.tolerance,
            shape=tuple(header.kv.shape),
            scales=tuple(section.scales),
            words=words,
            escapes=escapes,
        )
    return Container(header, token_code, residual)


def _fields(cls: type, raw: Any, absent: frozenset[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TypeError(f"{cls.__name__} must be a JSON object")
    names = set(cls.__dataclass_fields__) - absent  # type: ignore[attr-defined]
    if set(raw) != names:
        raise KeyError(f"{cls.__name__} fields {sorted(raw)} differ from {sorted(names)}")
    return raw


_V2_TOKEN_FIELDS = frozenset({"level", "segments", "vocab_size"})


def _parse_header(raw: Any, version: int) -> Header:
    top = _fields(Header, raw)
    if int(top["format_version"]) != version:
        raise ValueError(f"header version {top['format_version']} differs from the file's")
    kv = _fields(KVSection, top["kv"])
    residual = kv["residual"]
    prefix = top["prefix"]
    return Header(
        format_version=int(top["format_version"]),
        writer=str(top["writer"]),
        model=ModelIdentity(**_fields(ModelIdentity, top["model"])),
        profile=ExecutionProfile(**_fields(ExecutionProfile, top["profile"])),
        prefix=None if prefix is None else PrefixSection(**_fields(PrefixSection, prefix)),
        tokens=TokenSection(**_fields(TokenSection, top["tokens"],
                                      _V2_TOKEN_FIELDS if version == 1 else frozenset())),
        kv=KVSection(
            shape=[int(n) for n in kv["shape"]],
            dtype=str(kv["dtype"]),
            sha256=str(kv["sha256"]),
            residual=None if residual is None
            else ResidualSection(**_fields(ResidualSection, residual)),
        ),
    )


def write_container_file(path: str | Path, data: bytes) -> None:
    """Write .skv bytes to ``path`` atomically (see ``seqkv.files.write_atomically``)."""
    write_atomically(path, data)

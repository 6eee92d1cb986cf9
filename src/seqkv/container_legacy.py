"""Reading .skv files of format versions 1 and 2 (a JSON header): kept so old files still decode.

Layout (all integers little-endian)::

    magic        8 bytes   b"\\x89SKV\\r\\n\\x1a\\n"
    version      u16       1 or 2
    reserved     u16       0
    header_len   u32       length of the JSON header
    section_len  3 x u64   token code, residual words, residual escapes
    header       JSON      model identity, execution profile, tokens, KV (see ``_parse_header``)
    sections     bytes     in the order above
    sha256       32 bytes  of everything before it

Version 1 predates coding levels: its files read as the ``tokens`` level in one segment. This
module only reads; ``seqkv upgrade`` rewrites such files in the current format
(``seqkv.container``) without re-coding them.

Invariants:
1. ``read_legacy`` checks, in this order, magic, version, length and checksum before it parses
   the header, so each kind of damage gets its own error (enforced; one test each).
2. Every field the JSON header carries is type-checked while it is parsed; a file that passes
   the checksum but holds a malformed header is CorruptFileError (enforced).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

from seqkv.coding.arithmetic import BitStream
from seqkv.coding.residual_code import ResidualCode, ResidualMode
from seqkv.errors import (
    CorruptFileError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from seqkv.types import ExecutionProfile, ModelIdentity

LEGACY_MAGIC = b"\x89SKV\r\n\x1a\n"
LEGACY_VERSIONS = (1, 2)
_PREFIX = struct.Struct("<8sHHIQQQ")
_DIGEST_BYTES = 32
_LEVELS = ("tokens", "rows", "segments", "ngram", "plain")


@dataclass(frozen=True)
class LegacyFile:
    """What a version-1 or 2 file holds, as read."""

    version: int
    writer: str
    model: ModelIdentity
    profile: ExecutionProfile
    count: int
    first_token_context: int | None
    tokens_sha256: str
    level: str  # "tokens", "rows", "segments", "ngram" or "plain"
    segments: tuple[int, ...]
    vocab_size: int | None
    kv_shape: tuple[int, ...]
    kv_sha256: str
    prefix_hash: str | None
    prefix_tokens: int
    prefix_kv_sha256: str
    token_code: BitStream
    residual: ResidualCode | None


def read_legacy(data: bytes) -> LegacyFile:
    """Parse a version-1 or 2 file (its magic already matched)."""
    if len(data) < _PREFIX.size:
        raise TruncatedFileError(f"the .skv file ends after {len(data)} bytes, inside its prefix")
    _, version, _, header_len, token_len, words_len, escapes_len = _PREFIX.unpack_from(data)
    if version not in LEGACY_VERSIONS:
        raise UnsupportedVersionError(
            f"the .skv file has format version {version}; this seqkv reads versions 1, 2 and 3: "
            "use the seqkv release that wrote it"
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
        return _parse(json.loads(header_bytes), version, token_data, words, escapes)
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise CorruptFileError(f"the .skv header is malformed: {error}") from error


def _object(raw: Any, name: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TypeError(f"{name} must be a JSON object")
    if set(raw) != keys:
        raise KeyError(f"{name} fields {sorted(raw)} differ from {sorted(keys)}")
    return raw


def _int(value: Any, name: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, not {value!r}")
    return value


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {value!r}")
    return value


def _parse(raw: Any, version: int, token_data: bytes, words: bytes,
           escapes: bytes) -> LegacyFile:
    top = _object(raw, "header", {"format_version", "writer", "model", "profile", "prefix",
                                  "tokens", "kv"})
    if top["format_version"] != version:
        raise ValueError(f"header version {top['format_version']!r} differs from the file's")
    model = _object(top["model"], "model", {"name", "config_sha256", "weights_sha256",
                                            "tokenizer_sha256"})
    profile = _object(top["profile"], "profile", {
        "schedule", "dtype", "device_class", "cpu_capability", "num_threads", "torch_version",
        "transformers_version"})
    token_keys = {"count", "num_bits", "first_token_context", "sha256"}
    if version == 2:
        token_keys |= {"level", "segments", "vocab_size"}
    tokens = _object(top["tokens"], "tokens", token_keys)
    kv = _object(top["kv"], "kv", {"shape", "dtype", "sha256", "residual"})
    count = _int(tokens["count"], "tokens.count")
    level = _str(tokens.get("level", "tokens"), "tokens.level")
    if level not in _LEVELS:
        raise UnsupportedVersionError(
            f"the file was coded at level {level!r}, which this seqkv does not know: use the "
            "seqkv release that wrote it")
    segments_raw = tokens.get("segments") or [count]
    if not isinstance(segments_raw, list):
        raise TypeError("tokens.segments must be a list")
    segments = tuple(_int(n, "tokens.segments[]", 1) for n in segments_raw)
    vocab = tokens.get("vocab_size")
    shape_raw = kv["shape"]
    if not isinstance(shape_raw, list) or len(shape_raw) != 5:
        raise ValueError("kv.shape must be a list of 5 integers")
    shape = tuple(_int(n, "kv.shape[]") for n in shape_raw)
    context = tokens["first_token_context"]
    residual = None
    if kv["residual"] is not None:
        section = _object(kv["residual"], "kv.residual", {"mode", "tolerance", "scales",
                                                          "num_escapes", "max_abs_error"})
        scales = section["scales"]
        if not isinstance(scales, list):
            raise TypeError("kv.residual.scales must be a list")
        residual = ResidualCode(ResidualMode(section["mode"]), float(section["tolerance"]),
                                shape, tuple(float(s) for s in scales), words, escapes)
    prefix = top["prefix"]
    prefix_fields = None if prefix is None else _object(prefix, "prefix", {
        "prefix_hash", "tokens", "kv_sha256"})
    return LegacyFile(
        version=version,
        writer=_str(top["writer"], "writer"),
        model=ModelIdentity(_str(model["name"], "model.name"),
                            _str(model["config_sha256"], "model.config_sha256"),
                            _str(model["weights_sha256"], "model.weights_sha256"),
                            None if model["tokenizer_sha256"] is None
                            else _str(model["tokenizer_sha256"], "model.tokenizer_sha256")),
        profile=ExecutionProfile(
            schedule=_str(profile["schedule"], "profile.schedule"),  # type: ignore[arg-type]
            dtype=_str(profile["dtype"], "profile.dtype"),
            device_class=_str(profile["device_class"], "profile.device_class"),
            cpu_capability=_str(profile["cpu_capability"], "profile.cpu_capability"),
            num_threads=_int(profile["num_threads"], "profile.num_threads", 1),
            torch_version=_str(profile["torch_version"], "profile.torch_version"),
            transformers_version=_str(profile["transformers_version"],
                                      "profile.transformers_version")),
        count=count,
        first_token_context=None if context is None else _int(context, "first_token_context"),
        tokens_sha256=_str(tokens["sha256"], "tokens.sha256"),
        level=level,
        segments=segments,
        vocab_size=None if vocab is None else _int(vocab, "tokens.vocab_size", 1),
        kv_shape=shape,
        kv_sha256=_str(kv["sha256"], "kv.sha256"),
        prefix_hash=None if prefix_fields is None
        else _str(prefix_fields["prefix_hash"], "prefix.prefix_hash"),
        prefix_tokens=0 if prefix_fields is None else _int(prefix_fields["tokens"],
                                                           "prefix.tokens", 1),
        prefix_kv_sha256="" if prefix_fields is None
        else _str(prefix_fields["kv_sha256"], "prefix.kv_sha256"),
        token_code=BitStream(token_data, _int(tokens["num_bits"], "tokens.num_bits")),
        residual=residual,
    )

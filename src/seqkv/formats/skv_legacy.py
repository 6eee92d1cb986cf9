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
module only reads, into the current value (``upgraded``: a ``seqkv.session.CodedSession``, with
the file's full descriptions beside it), so nothing downstream knows an old file from a new one;
``seqkv upgrade`` rewrites such files in the current format (``seqkv.formats.skv``) without
re-coding them.

Invariants:
1. ``read_legacy`` checks, in this order, magic, version, length and checksum before it parses
   the header, so each kind of damage gets its own error (enforced; one test each).
2. Every field the JSON header carries is checked for its type and range while it is parsed,
   and against the others and the sections' sizes (segments add up to the count, the KV shape
   covers the positions, scales one per group, ``num_bits`` fits the code, escapes match their
   count); a file that passes the checksum but holds anything else is CorruptFileError
   (enforced; ``tests/test_fuzz_skv.py``).
3. The JSON header is parsed only after its size (``LEGACY_SKV_HEADER_BYTES``) and nesting depth are
   checked (in time linear in its size), and with NaN, Infinity and repeated keys refused
   (enforced: ``seqkv.formats.framing``).
4. ``upgraded`` refuses, before any decoding, a file that the reader's model cannot have coded
   (another model, another start token, a KV of another geometry), where the reader says which
   model it is; fields the old profile lacks (the CPU model, the row block) are taken as the
   reader's when the rest of the profile is the reader's (enforced; the decode's checksums still
   catch a wrong guess).
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from seqkv.coding.arithmetic import BitStream
from seqkv.coding.residual_code import ResidualCode, ResidualMode
from seqkv.digests import DIGEST_BYTES, Digest, model_digest, profile_digest
from seqkv.errors import (
    CorruptFileError,
    InvalidKVError,
    ModelMismatchError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from seqkv.formats.framing import load_json
from seqkv.limits import (
    LEGACY_SKV_HEADER_BYTES,
    LEGACY_SKV_HEADER_DEPTH,
    LEGACY_SKV_STRING,
    LEGACY_SKV_THREADS,
    MAX_GROUPS,
    MAX_POSITIONS,
    MAX_SEGMENTS,
    MAX_VOCAB,
)
from seqkv.session import CodedSession, PrefixRef
from seqkv.types import ExecutionProfile, KVGeometry, ModelIdentity, Schedule

LEGACY_MAGIC = b"\x89SKV\r\n\x1a\n"
LEGACY_VERSIONS = (1, 2)
_PREFIX = struct.Struct("<8sHHIQQQ")
_DIGEST_BYTES = 32
_LEVELS = ("tokens", "rows", "segments", "ngram", "plain")
_MODEL_FREE = ("ngram", "plain")
_DTYPES = ("float32", "float16", "bfloat16", "float64")
_SHA256 = re.compile("[0-9a-f]{64}")


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
    _, version, reserved, header_len, token_len, words_len, escapes_len = _PREFIX.unpack_from(
        data)
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
    if reserved:
        raise CorruptFileError(f"the .skv file's reserved field is {reserved}, not 0")
    offset = _PREFIX.size
    header_bytes = body[offset : offset + header_len]
    offset += header_len
    token_data = body[offset : offset + token_len]
    offset += token_len
    words = body[offset : offset + words_len]
    escapes = body[offset + words_len :]
    raw = load_json(header_bytes, "the .skv header", CorruptFileError,
                    LEGACY_SKV_HEADER_BYTES, LEGACY_SKV_HEADER_DEPTH)
    return _parse(raw, version, token_data, words, escapes)


def _fail(message: str) -> CorruptFileError:
    return CorruptFileError(f"the .skv header is malformed: {message}")


def _object(raw: Any, name: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _fail(f"{name} must be a JSON object")
    if set(raw) != keys:
        raise _fail(f"{name} fields {sorted(raw)} differ from {sorted(keys)}")
    return raw


def _int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(f"{name} must be an integer in [{low:,}, {high:,}], not {_show(value)}")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(f"{name} must be a number, not {_show(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise _fail(f"{name} {_show(value)} is out of range") from None
    if not math.isfinite(number):
        raise _fail(f"{name} must be finite, not {_show(value)}")
    return number


def _str(value: Any, name: str, choices: tuple[str, ...] = ()) -> str:
    if not isinstance(value, str) or len(value) > LEGACY_SKV_STRING:
        raise _fail(f"{name} must be a string of at most {LEGACY_SKV_STRING} characters, not "
                    f"{_show(value)}")
    if choices and value not in choices:
        raise _fail(f"{name} must be one of {', '.join(choices)}, not {_show(value)}")
    return value


def _sha256(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise _fail(f"{name} must be 64 lowercase hexadecimal digits, not {_show(value)}")
    return value


def _list(value: Any, name: str, high: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > high:
        raise _fail(f"{name} must be a list of at most {high} entries, not {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse(raw: Any, version: int, token_data: bytes, words: bytes,
           escapes: bytes) -> LegacyFile:
    top = _object(raw, "header", {"format_version", "writer", "model", "profile", "prefix",
                                  "tokens", "kv"})
    if top["format_version"] != version or isinstance(top["format_version"], bool):
        raise _fail(f"header version {_show(top['format_version'])} differs from the file's")
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
    count = _int(tokens["count"], "tokens.count", 1, MAX_POSITIONS)
    level = tokens.get("level", "tokens")
    if not isinstance(level, str) or level not in _LEVELS:
        raise UnsupportedVersionError(
            f"the file was coded at level {_show(level)}, which this seqkv does not know: use the "
            "seqkv release that wrote it")
    segments = _segments(tokens.get("segments", [count]), level, count)
    vocab_raw = tokens.get("vocab_size")
    vocab = None if vocab_raw is None else _int(vocab_raw, "tokens.vocab_size", 2, MAX_VOCAB)
    if vocab is None and level in _MODEL_FREE:
        raise _fail(f"tokens.vocab_size is missing, which the {level} level needs")
    context_raw = tokens["first_token_context"]
    context = None if context_raw is None else _int(context_raw, "tokens.first_token_context",
                                                     0, MAX_VOCAB - 1)
    if vocab is not None and context is not None and context >= vocab:
        raise _fail(f"tokens.first_token_context {context} lies outside the vocabulary of "
                    f"{vocab}")
    num_bits = _int(tokens["num_bits"], "tokens.num_bits", 0, 8 * len(token_data))
    if (num_bits + 7) // 8 != len(token_data):
        raise _fail(f"tokens.num_bits {num_bits} does not fit the {len(token_data)}-byte code")
    if token_data and token_data[-1] & ((1 << (-num_bits % 8)) - 1):
        raise _fail("the token code's unused bits are not zeros")
    prefix = top["prefix"]
    prefix_fields = None if prefix is None else _object(prefix, "prefix", {
        "prefix_hash", "tokens", "kv_sha256"})
    prefix_tokens = 0 if prefix_fields is None else _int(
        prefix_fields["tokens"], "prefix.tokens", 1, MAX_POSITIONS - count)
    shape = _kv_shape(kv, count + prefix_tokens)
    residual = _residual(kv["residual"], shape, words, escapes)
    return LegacyFile(
        version=version,
        writer=_str(top["writer"], "writer"),
        model=ModelIdentity(_str(model["name"], "model.name"),
                            _sha256(model["config_sha256"], "model.config_sha256"),
                            _sha256(model["weights_sha256"], "model.weights_sha256"),
                            None if model["tokenizer_sha256"] is None
                            else _sha256(model["tokenizer_sha256"], "model.tokenizer_sha256")),
        profile=ExecutionProfile(
            schedule=_schedule(profile["schedule"]),
            dtype=_str(profile["dtype"], "profile.dtype", _DTYPES),
            device_class=_str(profile["device_class"], "profile.device_class"),
            cpu_capability=_str(profile["cpu_capability"], "profile.cpu_capability"),
            num_threads=_int(profile["num_threads"], "profile.num_threads", 1, LEGACY_SKV_THREADS),
            torch_version=_str(profile["torch_version"], "profile.torch_version"),
            transformers_version=_str(profile["transformers_version"],
                                      "profile.transformers_version")),
        count=count,
        first_token_context=context,
        tokens_sha256=_sha256(tokens["sha256"], "tokens.sha256"),
        level=level,
        segments=segments,
        vocab_size=vocab,
        kv_shape=shape,
        kv_sha256=_sha256(kv["sha256"], "kv.sha256"),
        prefix_hash=None if prefix_fields is None
        else _sha256(prefix_fields["prefix_hash"], "prefix.prefix_hash"),
        prefix_tokens=prefix_tokens,
        prefix_kv_sha256="" if prefix_fields is None
        else _sha256(prefix_fields["kv_sha256"], "prefix.kv_sha256"),
        token_code=BitStream(token_data, num_bits),
        residual=residual,
    )


def _schedule(value: Any) -> Schedule:
    if value == "token-by-token":
        return "token-by-token"
    if value == "rows":
        return "rows"
    raise _fail(f"profile.schedule must be token-by-token or rows, not {_show(value)}")


def _segments(raw: Any, level: str, count: int) -> tuple[int, ...]:
    items = _list(raw, "tokens.segments", MAX_SEGMENTS)
    segments = tuple(_int(n, "tokens.segments[]", 1, count) for n in items)
    if sum(segments) != count:
        raise _fail(f"tokens.segments add up to {sum(segments):,}, not the {count:,} tokens")
    if level == "segments" and len(segments) < 2:
        raise _fail("the segments level needs at least 2 segments")
    if level != "segments" and len(segments) != 1:
        raise _fail(f"the {level} level codes one segment, not {len(segments)}")
    return segments


def _kv_shape(kv: dict[str, Any], positions: int) -> tuple[int, ...]:
    _str(kv["dtype"], "kv.dtype", ("float32",))
    raw = _list(kv["shape"], "kv.shape", 5)
    if len(raw) != 5:
        raise _fail("kv.shape must be a list of 5 integers")
    shape = tuple(_int(n, "kv.shape[]", 1, MAX_POSITIONS) for n in raw)
    if shape[1] != 2 or shape[3] != positions or 2 * shape[0] > MAX_GROUPS:
        raise _fail(f"kv.shape {list(shape)} is not [layers <= {MAX_GROUPS // 2}, 2, heads, "
                    f"{positions}, head_dim]")
    return shape


def _residual(raw: Any, shape: tuple[int, ...], words: bytes,
              escapes: bytes) -> ResidualCode | None:
    if raw is None:
        if words or escapes:
            raise _fail("the file holds residual bytes but no residual")
        return None
    section = _object(raw, "kv.residual", {"mode", "tolerance", "scales", "num_escapes",
                                           "max_abs_error"})
    mode = _str(section["mode"], "kv.residual.mode", tuple(m.value for m in ResidualMode))
    tolerance = _number(section["tolerance"], "kv.residual.tolerance")
    groups = shape[0] * shape[1]
    scales = tuple(_number(s, "kv.residual.scales[]")
                   for s in _list(section["scales"], "kv.residual.scales", groups))
    if len(scales) != groups:
        raise _fail(f"kv.residual.scales has {len(scales)} entries, not {groups}")
    if _int(section["num_escapes"], "kv.residual.num_escapes", 0, MAX_POSITIONS) * 4 != len(
            escapes):
        raise _fail("kv.residual.num_escapes differs from the escapes the file holds")
    if _number(section["max_abs_error"], "kv.residual.max_abs_error") < 0:
        raise _fail("kv.residual.max_abs_error is negative")
    code = ResidualCode(ResidualMode(mode), tolerance, shape, scales, words, escapes).check()
    if not all(math.isfinite(value) for (value,) in struct.iter_unpack("<f", escapes)):
        raise CorruptFileError("the .skv residual escapes a value that is not finite")
    return code


@dataclass(frozen=True)
class ReaderModel:
    """The model on the reading side: what an old file must have been coded with."""

    identity: ModelIdentity
    start_token: int | None  # the context the first token is coded after (None: uniform)
    geometry: KVGeometry


@dataclass(frozen=True)
class ReaderSide:
    """What upgrading an old file on read needs to know of the reader (None: unknown, not
    checked): its model, and its execution profile for the schedule and dtype a file states."""

    model: ReaderModel | None = None
    profile: Callable[[ExecutionProfile], ExecutionProfile] | None = None


@dataclass(frozen=True)
class LegacyRead:
    """An old file read into the current value, with the full descriptions it carried."""

    session: CodedSession
    version: int
    writer: str
    model: ModelIdentity
    profile: ExecutionProfile  # completed with the reader's CPU model and row block where known


def upgraded(file: LegacyFile, side: ReaderSide) -> LegacyRead:
    """``file`` as a ``CodedSession`` (module invariant 4)."""
    model = model_digest(file.model)
    if side.model is not None:
        reader = side.model
        if not file.model.same_model(reader.identity):
            raise ModelMismatchError(
                f"the file was coded with model {file.model.name!r} (weights "
                f"{file.model.weights_sha256[:12]}), not with {reader.identity.name!r} (weights "
                f"{reader.identity.weights_sha256[:12]}): decode it with the model that coded "
                "it")
        if file.first_token_context != reader.start_token:
            raise ModelMismatchError(
                f"the file's first token was coded after token {file.first_token_context}, this "
                f"model starts after {reader.start_token}: its tokenizer or config differs from "
                "the coder's")
        geometry = reader.geometry
        expected = (geometry.layers, 2, geometry.kv_heads, file.kv_shape[3], geometry.head_dim)
        if file.kv_shape != expected:
            raise InvalidKVError(f"the file's KV has shape {list(file.kv_shape)}, this model's "
                                 f"for {file.kv_shape[3]} tokens {list(expected)}")
        model = model_digest(reader.identity)
    profile = file.profile
    if side.profile is not None:
        here = side.profile(profile)
        if replace(here, cpu_model="", row_block=0) == replace(profile, cpu_model="",
                                                              row_block=0):
            profile = replace(profile, cpu_model=here.cpu_model, row_block=here.row_block)
    parameter = len(file.segments) if file.level == "segments" else 0
    prefix = None
    if file.prefix_hash is not None:
        prefix = PrefixRef(file.prefix_hash, file.prefix_tokens,
                           Digest(bytes.fromhex(file.prefix_kv_sha256)[:DIGEST_BYTES]))
    session = CodedSession(
        level=f"segments:{parameter}" if parameter else file.level,
        count=file.count,
        segments=file.segments,
        vocab_size=file.vocab_size if file.level in _MODEL_FREE else None,
        model_digest=model,
        profile_digest=profile_digest(profile),
        tokens_digest=Digest(bytes.fromhex(file.tokens_sha256)[:DIGEST_BYTES]),
        kv_digest=Digest(bytes.fromhex(file.kv_sha256)[:DIGEST_BYTES]),
        prefix=prefix,
        dictionary=None,
        token_code=file.token_code,
        residual=file.residual,
    )
    return LegacyRead(session, file.version, file.writer, file.model, profile)

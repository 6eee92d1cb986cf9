"""Content-addressed mixing dictionaries: token content shared across a store's sessions.

The model codes a session at its own cross-entropy and already copies well from the session's own
context. What it cannot see is the rest of the store: retrieved documents, tool outputs, pasted
files and templates that recur across sessions at positions prefix sharing cannot reach. A
dictionary (like zstd's trained dictionaries) is an immutable snapshot of such content, built from
a sample of sessions' token sequences; the mixer (``seqkv.mixing.mixer``) predicts from it, and
a file coded with it references it by digest.

What it holds: the distinct token content of the sample, once. ``build_dictionary`` walks the
sample in order and skips every span already present (``dedupe_tokens`` tokens or longer); each
maximal run of new tokens becomes a segment. Everything a predictor needs (the match index, n-gram
counts) is derived from the content when a ``DictionaryIndex`` is built and is not stored.

Size policy: at most ``max_tokens`` tokens. When the deduplicated sample holds more, segments are
kept by how often later sample sessions repeated them (repeated tokens per segment token), ties
to the earlier segment, and kept in sample order. Content seen once in the sample goes first.

Format 2 (the format written) frames four sections with ``seqkv.formats.framing`` (4-byte
magic ``\\x89SKD``, version byte, section lengths, CRC-32); integers are minimal LEB128 varints::

    header      vocabulary size varint, token width u8 (2 or 4 bytes: 2 when the vocabulary
                fits), segment count varint, token count varint
    namespace   UTF-8
    lengths     one varint per segment, each >= 1
    tokens      little-endian unsigned integers of the token width

The digest, the dictionary's identity, is the SHA-256 of its canonical content encoding, which is
the serialization of format 1 (little-endian, without its last 32 bytes)::

    magic b"SEQKVDIC" | version u16 = 1 | token width u16 | vocab u32 | namespace length u32
    | segment count u32 | token count u64 | namespace | segment lengths (u32 each) | tokens

so a dictionary keeps its digest across the two formats, and files of format 1 (that encoding
followed by its SHA-256) still read. The content encoding is canonical (one byte string per
content), so equal content means equal digests. The namespace is part of the content: a store
builds one dictionary per namespace/tenant, and dictionaries of two tenants never share a digest
even when their tokens agree.

Invariants:
1. A ``Dictionary`` never changes after construction; its token array is read-only (enforced).
2. ``digest`` is the SHA-256 of the content encoding (enforced: computed on construction, so
   ``from_bytes`` of either format recomputes it from what it read).
3. Every token is below ``vocab_size`` and the segment lengths sum to the token count
   (enforced on construction and on reading).
4. ``from_bytes`` accepts exactly the bytes ``to_bytes`` writes (and files of format 1) and
   refuses anything else with a specific ``DictionaryError``: every field is checked against its
   range and the sections' sizes before anything is allocated by it (enforced; tested on
   truncations, bit flips and ``tests/test_fuzz_dictionary.py``).
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NewType

import numpy as np
import numpy.typing as npt

from seqkv.errors import InvalidArgumentTypeError
from seqkv.formats.framing import FramingErrors, SectionReader, encode_varint, frame, unframe
from seqkv.limits import MAX_VOCAB
from seqkv.mixing.errors import (
    CorruptDictionaryError,
    DictionaryMismatchError,
    InvalidDictionaryInputError,
    NotADictionaryError,
    TruncatedDictionaryError,
    UnsupportedDictionaryVersionError,
)

DictionaryDigest = NewType("DictionaryDigest", str)  # 64 lowercase hex digits

MAGIC = b"\x89SKD"
LEGACY_MAGIC = b"SEQKVDIC"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
_ERRORS = FramingErrors(NotADictionaryError, NotADictionaryError,
                        UnsupportedDictionaryVersionError, TruncatedDictionaryError,
                        CorruptDictionaryError)
_WHAT = "the dictionary"
_HEADER = struct.Struct("<8sHHIIIQ")
_DIGEST_BYTES = 32


@dataclass(frozen=True)
class DictionaryPolicy:
    """How ``build_dictionary`` bounds and deduplicates a dictionary."""

    # NOTE: 2**20 tokens is 2 MiB at a 49,152-token vocabulary: small beside one session's KV
    # (SmolLM2-135M holds ~23 KB of KV per token), and the match index stays ~20 MB.
    max_tokens: int = 1 << 20
    # NOTE: a span of 16 tokens (~60 characters of text) already present is not stored again;
    # shorter repeats are kept because the match model needs the context around them.
    dedupe_tokens: int = 16

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidDictionaryInputError(
                f"max_tokens must be at least 1, not {self.max_tokens}")
        if self.dedupe_tokens < 2:
            raise InvalidDictionaryInputError(
                f"dedupe_tokens must be at least 2, not {self.dedupe_tokens}")


class Dictionary:
    """An immutable dictionary snapshot: a namespace, a vocabulary size and token segments."""

    __slots__ = ("_bytes", "_digest", "_namespace", "_segment_lengths", "_tokens", "_vocab_size")

    def __init__(self, tokens: npt.ArrayLike, segment_lengths: Sequence[int], vocab_size: int,
                 namespace: str = "") -> None:
        if not isinstance(namespace, str):
            raise InvalidArgumentTypeError(
                f"a dictionary's namespace is a str, not {type(namespace).__name__}")
        if not namespace.isascii() and any(0xD800 <= ord(c) <= 0xDFFF for c in namespace):
            raise InvalidDictionaryInputError(
                f"the namespace {namespace!r:.60} holds a lone surrogate, which UTF-8 cannot "
                "encode: pass a namespace of valid text")
        array = np.array(tokens, dtype=np.int64).reshape(-1)
        lengths = tuple(int(length) for length in segment_lengths)
        if not 2 <= vocab_size <= MAX_VOCAB:
            raise InvalidDictionaryInputError(
                f"vocab_size must be in 1..2**32 - 1, not {vocab_size}")
        if any(length < 1 for length in lengths) or sum(lengths) != array.shape[0]:
            raise InvalidDictionaryInputError(
                f"segment lengths {lengths[:8]}... must be positive and sum to the "
                f"{array.shape[0]} tokens")
        if array.size and (int(array.min()) < 0 or int(array.max()) >= vocab_size):
            raise InvalidDictionaryInputError(
                f"dictionary tokens must lie in 0..{vocab_size - 1}: were they made by another "
                "tokenizer?")
        stored = array.astype(np.uint32)
        stored.flags.writeable = False
        self._tokens = stored
        self._segment_lengths = lengths
        self._vocab_size = vocab_size
        self._namespace = namespace
        self._digest = DictionaryDigest(hashlib.sha256(
            _content_encoding(stored, lengths, vocab_size, namespace)).hexdigest())
        self._bytes = _file(stored, lengths, vocab_size, namespace)

    @property
    def tokens(self) -> npt.NDArray[np.uint32]:
        """All segments' tokens, concatenated (read-only)."""
        return self._tokens

    @property
    def segment_lengths(self) -> tuple[int, ...]:
        return self._segment_lengths

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def digest(self) -> DictionaryDigest:
        """SHA-256 of the content encoding: what files coded with it reference."""
        return self._digest

    @property
    def size_bytes(self) -> int:
        """Bytes of the dictionary's file (``to_bytes``)."""
        return len(self._bytes)

    def __len__(self) -> int:
        return int(self._tokens.shape[0])

    def __repr__(self) -> str:
        return (f"Dictionary({len(self)} tokens in {len(self._segment_lengths)} segments, "
                f"namespace={self._namespace!r}, digest={self._digest[:12]}...)")

    def to_bytes(self) -> bytes:
        """The file of format 2 (see the module docstring)."""
        return self._bytes

    @classmethod
    def from_bytes(cls, data: bytes, expected: DictionaryDigest | None = None) -> Dictionary:
        """Read a serialized dictionary; with ``expected``, refuse any other dictionary."""
        if data[: len(LEGACY_MAGIC)] == LEGACY_MAGIC:
            tokens, lengths, vocab, namespace = _read_format_1(memoryview(data))
        else:
            tokens, lengths, vocab, namespace = _read(data)
        try:
            dictionary = cls(tokens, lengths, vocab, namespace)
        except InvalidDictionaryInputError as error:
            raise CorruptDictionaryError(
                f"the dictionary's content is inconsistent: {error}") from None
        if expected is not None and dictionary.digest != expected:
            raise DictionaryMismatchError(
                f"this dictionary's digest is {dictionary.digest[:16]}..., the coded data needs "
                f"{expected[:16]}...: load the dictionary the data was coded with")
        return dictionary


def _token_width(vocab_size: int) -> int:
    return 2 if vocab_size <= 1 << 16 else 4


def _token_dtype(width: int) -> str:
    return "<u2" if width == 2 else "<u4"


def _content_encoding(tokens: npt.NDArray[np.uint32], lengths: tuple[int, ...], vocab_size: int,
                      namespace: str) -> bytes:
    """The canonical encoding the digest is taken of (format 1 without its digest)."""
    name = namespace.encode("utf-8")
    width = _token_width(vocab_size)
    header = _HEADER.pack(LEGACY_MAGIC, 1, width, vocab_size, len(name), len(lengths),
                          tokens.shape[0])
    return b"".join([
        header,
        name,
        np.asarray(lengths, dtype="<u4").tobytes(),
        tokens.astype(_token_dtype(width)).tobytes(),
    ])


def _file(tokens: npt.NDArray[np.uint32], lengths: tuple[int, ...], vocab_size: int,
          namespace: str) -> bytes:
    width = _token_width(vocab_size)
    header = b"".join([encode_varint(vocab_size), bytes([width]), encode_varint(len(lengths)),
                       encode_varint(tokens.shape[0])])
    return frame(MAGIC, FORMAT_VERSION, [
        header, namespace.encode("utf-8"), b"".join(encode_varint(n) for n in lengths),
        tokens.astype(_token_dtype(width)).tobytes()])


def _read(data: bytes) -> tuple[npt.NDArray[np.integer], list[int], int, str]:
    _, sections = unframe(data, MAGIC, (FORMAT_VERSION,), _ERRORS, _WHAT, READABLE_VERSIONS)
    if len(sections) != 4:
        raise CorruptDictionaryError(f"the dictionary has {len(sections)} sections, not 4")
    header = SectionReader(sections[0], "the dictionary's header", CorruptDictionaryError)
    vocab = header.varint("vocabulary size", 2, MAX_VOCAB)
    width = header.u8("token width")
    if width != _token_width(vocab):
        raise CorruptDictionaryError(
            f"token width {width} does not fit vocabulary {vocab}: the header is damaged")
    segments = header.varint("segment count", 0, len(sections[2]))
    count = header.varint("token count", segments, len(sections[3]) // width)
    header.finish()
    if width * count != len(sections[3]):
        raise CorruptDictionaryError(f"the dictionary declares {count:,} tokens but holds "
                                     f"{len(sections[3]):,} bytes of them")
    try:
        namespace = sections[1].decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorruptDictionaryError(f"the namespace is not UTF-8: {error}") from None
    reader = SectionReader(sections[2], "the dictionary's segment lengths",
                           CorruptDictionaryError)
    lengths = [reader.varint("segment length", 1, count) for _ in range(segments)]
    reader.finish()
    tokens = np.frombuffer(sections[3], dtype=_token_dtype(width))
    return tokens, lengths, vocab, namespace


def _read_format_1(view: memoryview) -> tuple[npt.NDArray[np.integer], list[int], int, str]:
    """A file of format 1: the content encoding followed by its SHA-256."""
    if len(view) < _HEADER.size:
        raise TruncatedDictionaryError(
            f"the dictionary holds {len(view)} bytes, less than its {_HEADER.size}-byte "
            "header: the file was cut short")
    _, version, width, vocab, name_length, segments, count = _HEADER.unpack_from(view)
    if version != 1:
        raise UnsupportedDictionaryVersionError(
            f"dictionary format version {version} is not supported (this seqkv reads "
            f"versions {', '.join(map(str, READABLE_VERSIONS))}): rebuild the dictionary or "
            "upgrade seqkv")
    if width != _token_width(vocab):
        raise CorruptDictionaryError(
            f"token width {width} does not fit vocabulary {vocab}: the header is damaged")
    expected_size = _HEADER.size + name_length + 4 * segments + width * count + _DIGEST_BYTES
    if len(view) < expected_size:
        raise TruncatedDictionaryError(
            f"the dictionary holds {len(view)} bytes, its header says {expected_size}: the "
            "file was cut short")
    if len(view) > expected_size:
        raise CorruptDictionaryError(
            f"the dictionary holds {len(view)} bytes, its header says {expected_size}: "
            "trailing bytes or a damaged header")
    body = view[: expected_size - _DIGEST_BYTES]
    if hashlib.sha256(body).digest() != bytes(view[expected_size - _DIGEST_BYTES :]):
        raise CorruptDictionaryError(
            "the dictionary's SHA-256 does not match its content: it was damaged after "
            "writing")
    offset = _HEADER.size
    try:
        namespace = bytes(view[offset : offset + name_length]).decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorruptDictionaryError(f"the namespace is not UTF-8: {error}") from None
    offset += name_length
    lengths = np.frombuffer(view, dtype="<u4", count=segments, offset=offset)
    offset += 4 * segments
    tokens = np.frombuffer(view, dtype=_token_dtype(width), count=count, offset=offset)
    return tokens, lengths.tolist(), vocab, namespace


def build_dictionary(sequences: Iterable[Sequence[int]], vocab_size: int, namespace: str = "",
                     policy: DictionaryPolicy | None = None) -> Dictionary:
    """A dictionary of the distinct content of ``sequences`` (see the module's size policy).

    The result is a pure function of the arguments: the same sample builds the same digest.

    >>> document = list(range(100, 140))
    >>> dictionary = build_dictionary([[1, 2, *document], [*document, 3]], vocab_size=1000)
    >>> len(dictionary), dictionary.segment_lengths  # the second copy is not stored again
    (43, (42, 1))
    >>> Dictionary.from_bytes(dictionary.to_bytes()).digest == dictionary.digest
    True
    """
    policy = policy or DictionaryPolicy()
    samples = [np.asarray(sequence, dtype=np.int64).reshape(-1) for sequence in sequences]
    total = sum(sample.shape[0] for sample in samples)
    if total == 0:
        raise InvalidDictionaryInputError(
            "there are no tokens to build a dictionary from: pass the sessions' token sequences")
    for sample in samples:
        if sample.size and (int(sample.min()) < 0 or int(sample.max()) >= vocab_size):
            raise InvalidDictionaryInputError(
                f"sample tokens must lie in 0..{vocab_size - 1}: were they made by another "
                "tokenizer?")
    content, lengths, repeats = _deduplicate([sample.tolist() for sample in samples],
                                             policy.dedupe_tokens)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if len(content) > policy.max_tokens:
        scores = [repeats[start:end].sum() / (end - start)
                  for start, end in itertools.pairwise(starts)]
        ranked = sorted(range(len(lengths)), key=lambda j: (-scores[j], j))
        kept: list[int] = []
        budget = policy.max_tokens
        for j in ranked:
            if lengths[j] <= budget:
                kept.append(j)
                budget -= lengths[j]
        kept.sort()
        content = [token for j in kept for token in content[starts[j] : starts[j + 1]]]
        lengths = [lengths[j] for j in kept]
    if not content:
        raise InvalidDictionaryInputError(
            f"no segment fits max_tokens={policy.max_tokens}: raise the limit")
    return Dictionary(content, lengths, vocab_size, namespace)


def _deduplicate(samples: list[list[int]], span: int
                 ) -> tuple[list[int], list[int], npt.NDArray[np.int64]]:
    """(content, segment lengths, per-content-token repeat counts) of the samples.

    Greedy and in order: at each sample position, a ``span``-token window already in the content
    is extended forward as far as it matches and skipped (its content tokens gain one repeat);
    any other token is appended to the current segment.
    """
    content: list[int] = []
    lengths: list[int] = []
    repeats = np.zeros(sum(len(sample) for sample in samples), dtype=np.int64)
    first: dict[tuple[int, ...], int] = {}
    for sample in samples:
        run = 0
        i = 0
        while i < len(sample):
            window = tuple(sample[i : i + span])
            position = first.get(window) if len(window) == span else None
            if position is None:
                content.append(sample[i])
                run += 1
                if run >= span:
                    first.setdefault(tuple(content[-span:]), len(content) - span)
                i += 1
                continue
            length = span
            while (i + length < len(sample) and position + length < len(content)
                   and content[position + length] == sample[i + length]):
                length += 1
            repeats[position : position + length] += 1
            if run:
                lengths.append(run)
                run = 0
            i += length
        if run:
            lengths.append(run)
    return content, lengths, repeats[: len(content)]

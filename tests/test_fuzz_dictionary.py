"""Fuzzing mixing dictionaries: format 2 (``seqkv.formats.framing``) and format 1 (content +
SHA-256).

Each case reads a mutated dictionary (``Dictionary.from_bytes``) and must end in a ``SeqKVError``
or in a dictionary whose file is exactly the bytes read (invariant 4 of
``seqkv.mixing.dictionary``: it accepts exactly what ``to_bytes`` writes). A crafted file with
a valid checksum may be a valid dictionary of other content (the framing's CRC-32 is no seal;
the digest, taken of the content, is the identity): that outcome is counted apart
(``fuzz_oracle.OTHER_VALID``) and must then be refused where the original's digest is expected,
and the ``portable+mix`` file coded with the original must decode with it to exactly the
original tokens and KV or end in a ``SeqKVError``. See ``tests/test_fuzz_harness.py`` for the
mutations, the budget and ``SEQKV_FUZZ_CASES``.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest
import torch

from fuzz_oracle import OTHER_VALID, CountingTally, run_case
from seqkv import compress, decompress
from seqkv.formats.framing import unframe
from seqkv.mixing.dictionary import (
    _ERRORS,
    _HEADER,
    FORMAT_VERSION,
    MAGIC,
    Dictionary,
    _content_encoding,
    build_dictionary,
)
from seqkv.mixing.errors import DictionaryMismatchError
from seqkv.models import CausalLM
from test_fuzz_harness import (
    Field,
    Walker,
    case_count,
    forge,
    mutate_bytes,
    mutate_framed,
    seed,
)


@dataclass(frozen=True)
class Original:
    """A valid dictionary file, and optionally a ``portable+mix`` file coded with it."""

    name: str
    dictionary: Dictionary
    skv: bytes | None = None
    tokens: list[int] | None = None
    kv: torch.Tensor | None = None


def format_1(dictionary: Dictionary) -> bytes:
    """The file format 1 wrote: the content encoding, then its SHA-256."""
    content = _content_encoding(dictionary.tokens, dictionary.segment_lengths,
                                dictionary.vocab_size, dictionary.namespace)
    return content + hashlib.sha256(content).digest()


@pytest.fixture(scope="module")
def originals(fuzz_model: CausalLM) -> list[Original]:
    rng = np.random.default_rng(7)
    vocab = fuzz_model.vocab_size
    documents = [rng.integers(0, vocab, 24).tolist() for _ in range(3)]
    mixing = build_dictionary([documents[0] + documents[1], documents[2] + documents[0]], vocab,
                              namespace="tenant-a")
    session = [3, *documents[0][:12], 9, *documents[2][:6]]
    skv = compress(fuzz_model, session, level="portable+mix", dictionary=mixing).data
    decoded = decompress(fuzz_model, skv, dictionaries={mixing.digest: mixing})
    wide = Dictionary([70_000, 5, 65_536, 1, 2, 3, 99_999], [3, 1, 3], 100_000)
    named = Dictionary([1, 2, 3, 4, 5], [2, 3], 6, namespace="名前-ns")
    return [Original("mix-tiny", mixing, skv, decoded.tokens, decoded.kv),
            Original("wide-tokens", wide), Original("unicode-namespace", named)]


def dictionary_fields(sections: list[bytes]) -> list[list[Field]]:
    """Where each field of a valid format-2 dictionary lies (see ``seqkv.mixing.dictionary``)."""
    header = Walker(sections[0])
    header.varint("vocabulary size")
    width = header.u8("token width")
    segments = header.varint("segment count")
    header.varint("token count")
    namespace = Walker(sections[1])
    namespace.rest("namespace")
    lengths = Walker(sections[2])
    for index in range(segments):
        lengths.varint(f"segment {index} length")
    tokens = Walker(sections[3])
    tokens.items(len(sections[3]) // width, width, "u16" if width == 2 else "u32", "token")
    return [header.fields, namespace.fields, lengths.fields, tokens.fields]


def _check_use(model: CausalLM, original: Original, dictionary: Dictionary) -> bool:
    """What a reader of files coded with ``original`` gets from ``dictionary``."""
    expected = original.dictionary.digest
    if dictionary.digest != expected:
        try:
            Dictionary.from_bytes(dictionary.to_bytes(), expected=expected)
        except DictionaryMismatchError:
            pass
        else:
            raise AssertionError("another dictionary passed for the expected digest")
    if original.skv is None:
        return True
    result = decompress(model, original.skv, dictionaries={expected: dictionary})
    return (result.tokens == original.tokens and original.kv is not None
            and torch.equal(result.kv, original.kv))


def _verdict(original: Original, dictionary: Dictionary) -> bool | str:
    same = (dictionary.digest == original.dictionary.digest
            and dictionary.to_bytes() == original.dictionary.to_bytes())
    return True if same else OTHER_VALID


def _attempt(model: CausalLM, original: Original, data: bytes) -> bool | str:
    dictionary = Dictionary.from_bytes(data)
    assert dictionary.to_bytes() == data, "a dictionary read that its writer would not write"
    if not _check_use(model, original, dictionary):
        return False
    return _verdict(original, dictionary)


def _attempt_format_1(model: CausalLM, original: Original, data: bytes) -> bool | str:
    dictionary = Dictionary.from_bytes(data)
    assert format_1(dictionary) == data, "a format-1 dictionary read that format 1 would not write"
    if not _check_use(model, original, dictionary):
        return False
    return _verdict(original, dictionary)


def test_fuzz_format_2_structure(fuzz_model: CausalLM, originals: list[Original]) -> None:
    for number, original in enumerate(originals):
        tally = CountingTally(f"dictionary-format2-{original.name}")
        rng = np.random.default_rng(seed(700 + number))
        data = original.dictionary.to_bytes()
        _, sections = unframe(data, MAGIC, (FORMAT_VERSION,), _ERRORS, "fixture")
        fields = dictionary_fields(sections)
        for _ in range(case_count(60)):
            what, mutated = mutate_framed(rng, sections, MAGIC, FORMAT_VERSION, fields)
            run_case(tally, what, partial(_attempt, fuzz_model, original, mutated))
        tally.check()


def test_fuzz_format_2_bytes(fuzz_model: CausalLM, originals: list[Original]) -> None:
    tally = CountingTally("dictionary-format2-bytes")
    rng = np.random.default_rng(seed(800))
    for _ in range(case_count(60)):
        original = originals[int(rng.integers(0, len(originals)))]
        what, data = mutate_bytes(rng, original.dictionary.to_bytes())
        run_case(tally, f"{original.name}: {what}",
                 partial(_attempt, fuzz_model, original, data))
    tally.check()
    assert tally.outcomes[OTHER_VALID] == 0  # the CRC-32 refuses every byte-level change


def format_1_fields(data: bytes) -> list[Field]:
    """Where each field of a valid format-1 dictionary lies (its SHA-256 excluded)."""
    _, _, width, _, name_length, segments, count = _HEADER.unpack_from(data)
    walker = Walker(data[:-32])
    walker.raw(8, "magic")
    for name, size in (("version", 2), ("token width", 2), ("vocabulary size", 4),
                       ("namespace length", 4), ("segment count", 4), ("token count", 8)):
        walker.raw(size, name, f"u{8 * size}")
    walker.raw(name_length, "namespace")
    walker.items(segments, 4, "u32", "segment length")
    walker.items(count, width, f"u{8 * width}", "token")
    return walker.fields


def mutate_format_1(rng: np.random.Generator, data: bytes,
                    fields: list[Field]) -> tuple[str, bytes]:
    """A structural mutation of a format-1 dictionary, its SHA-256 recomputed."""
    body = data[:-32]
    if rng.random() < 0.7:
        chosen = fields[int(rng.integers(0, len(fields)))]
        what, forged = forge(rng, body[chosen.offset : chosen.offset + chosen.length],
                             chosen.kind)
        what = f"{chosen.name} {what}"
        body = body[: chosen.offset] + forged + body[chosen.offset + chosen.length :]
    else:
        what, body = mutate_bytes(rng, body)
    return what, body + hashlib.sha256(body).digest()


def test_fuzz_format_1(fuzz_model: CausalLM, originals: list[Original]) -> None:
    for number, original in enumerate(originals):
        tally = CountingTally(f"dictionary-format1-{original.name}")
        rng = np.random.default_rng(seed(900 + number))
        data = format_1(original.dictionary)
        assert Dictionary.from_bytes(data).digest == original.dictionary.digest
        fields = format_1_fields(data)
        for _ in range(case_count(40)):
            what, mutated = mutate_format_1(rng, data, fields)
            run_case(tally, what,
                     partial(_attempt_format_1, fuzz_model, original, mutated))
        for _ in range(case_count(40) // 4):
            what, mutated = mutate_bytes(rng, data)
            run_case(tally, what,
                     partial(_attempt_format_1, fuzz_model, original, mutated))
        tally.check()


def test_the_dictionary_fields_cover_every_byte(originals: list[Original]) -> None:
    for original in originals:
        data = original.dictionary.to_bytes()
        _, sections = unframe(data, MAGIC, (FORMAT_VERSION,), _ERRORS, "fixture")
        fields = dictionary_fields(sections)
        for index in (0, 2):
            assert sum(f.length for f in fields[index]) == len(sections[index]), index
        legacy = format_1(original.dictionary)
        head = format_1_fields(legacy)[:7]
        assert sum(f.length for f in head) == _HEADER.size
        assert struct.unpack_from("<H", legacy, 8)[0] == 1

"""Mixing dictionaries: deduplicated content, a size policy, and a format that refuses damage."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import SeqKVError
from seqkv.formats.framing import encode_varint, frame, unframe
from seqkv.mixing.dictionary import (
    _ERRORS,
    FORMAT_VERSION,
    LEGACY_MAGIC,
    MAGIC,
    Dictionary,
    DictionaryDigest,
    DictionaryPolicy,
    _content_encoding,
    build_dictionary,
)
from seqkv.mixing.errors import (
    CorruptDictionaryError,
    DictionaryError,
    DictionaryMismatchError,
    InvalidDictionaryInputError,
    NotADictionaryError,
    TruncatedDictionaryError,
    UnsupportedDictionaryVersionError,
)

VOCAB = 1000


def _sequences(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    documents = [rng.integers(0, VOCAB, 40).tolist() for _ in range(4)]
    return [documents[0] + documents[1], documents[2] + documents[0], documents[3]]


def test_round_trip_keeps_content_namespace_and_digest() -> None:
    dictionary = build_dictionary(_sequences(), VOCAB, namespace="tenant-a")
    again = Dictionary.from_bytes(dictionary.to_bytes(), expected=dictionary.digest)
    assert again.tokens.tolist() == dictionary.tokens.tolist()
    assert again.segment_lengths == dictionary.segment_lengths
    assert (again.namespace, again.vocab_size) == ("tenant-a", VOCAB)
    assert again.digest == dictionary.digest
    assert again.size_bytes == len(dictionary.to_bytes())


def test_the_digest_is_a_function_of_the_content() -> None:
    first = build_dictionary(_sequences(), VOCAB)
    assert build_dictionary(_sequences(), VOCAB).digest == first.digest
    assert build_dictionary(_sequences(), VOCAB, namespace="other").digest != first.digest
    assert build_dictionary(_sequences(1), VOCAB).digest != first.digest
    assert Dictionary([1, 2, 3], [3], VOCAB).digest != Dictionary([1, 2, 3], [1, 2], VOCAB).digest


def test_golden_digest_of_a_small_dictionary() -> None:
    # The digest is taken of the content encoding (format 1's layout), which never changes: the
    # same content keeps its digest in every file format.
    dictionary = Dictionary([5, 6, 7, 8], [2, 2], 300, namespace="n")
    assert FORMAT_VERSION == 2
    assert dictionary.size_bytes == 10 + 5 + 1 + 2 + 2 * 4 + 4  # framing, sections, CRC
    assert dictionary.digest == Dictionary.from_bytes(dictionary.to_bytes()).digest
    assert dictionary.digest == GOLDEN_DIGEST


def _format_1(dictionary: Dictionary) -> bytes:
    """The file format 1 wrote: the content encoding followed by its SHA-256."""
    content = _content_encoding(dictionary.tokens, dictionary.segment_lengths,
                                dictionary.vocab_size, dictionary.namespace)
    return content + hashlib.sha256(content).digest()


def test_files_of_format_1_still_read_with_the_same_digest() -> None:
    dictionary = Dictionary([5, 6, 7, 8], [2, 2], 300, namespace="n")
    legacy = _format_1(dictionary)
    assert legacy[:8] == LEGACY_MAGIC and hashlib.sha256(legacy[:-32]).hexdigest() == GOLDEN_DIGEST
    again = Dictionary.from_bytes(legacy, expected=DictionaryDigest(GOLDEN_DIGEST))
    assert again.to_bytes() == dictionary.to_bytes()


def test_format_1_damage_is_refused() -> None:
    legacy = bytearray(_format_1(Dictionary([5, 6, 7, 8], [2, 2], 300, namespace="n")))
    legacy[-40] ^= 1
    with pytest.raises(CorruptDictionaryError, match="SHA-256"):
        Dictionary.from_bytes(bytes(legacy))


def _reframed(data: bytes, index: int, section: bytes) -> bytes:
    sections = unframe(data, MAGIC, (FORMAT_VERSION,), _ERRORS, "test")[1]
    sections[index] = section
    return frame(MAGIC, FORMAT_VERSION, sections)


def test_a_zero_segment_length_with_a_valid_checksum() -> None:
    data = Dictionary([5, 6, 7, 8], [2, 2], 300).to_bytes()
    with pytest.raises(CorruptDictionaryError, match="segment length 0"):
        Dictionary.from_bytes(_reframed(data, 2, b"\x00\x04"))


def test_a_token_outside_the_vocabulary_with_a_valid_checksum() -> None:
    data = Dictionary([5, 6, 7, 8], [2, 2], 300).to_bytes()
    with pytest.raises(CorruptDictionaryError, match=r"0\.\.299"):
        Dictionary.from_bytes(_reframed(data, 3, struct.pack("<4H", 5, 6, 7, 300)))


def test_a_huge_token_count_is_refused_before_allocating() -> None:
    data = Dictionary([5, 6, 7, 8], [2, 2], 300).to_bytes()
    header = encode_varint(300) + bytes([2]) + encode_varint(2) + encode_varint(10**15)
    with pytest.raises(CorruptDictionaryError, match="token count"):
        Dictionary.from_bytes(_reframed(data, 0, header))


GOLDEN_DIGEST = "80e86ba749d39b2073da222e92a2f858b58daf459d07ec5f7cde0084b545e3b8"


def test_tokens_are_read_only() -> None:
    dictionary = Dictionary([1, 2, 3], [3], VOCAB)
    with pytest.raises(ValueError):
        dictionary.tokens[0] = 9


def test_repeated_content_is_stored_once() -> None:
    sequences = _sequences()
    dictionary = build_dictionary(sequences, VOCAB)
    # documents 0..3 of 40 tokens each; document 0 appears twice in the sample
    assert len(dictionary) == 160
    content = dictionary.tokens.tolist()
    assert content[:80] == sequences[0]


def test_short_repeats_are_kept() -> None:
    sequence = list(range(10)) + list(range(10))
    dictionary = build_dictionary([sequence], VOCAB, policy=DictionaryPolicy(dedupe_tokens=16))
    assert dictionary.tokens.tolist() == sequence


def test_the_size_policy_keeps_the_most_repeated_segments() -> None:
    rng = np.random.default_rng(3)
    popular, rare = rng.integers(0, VOCAB, 30).tolist(), rng.integers(0, VOCAB, 30).tolist()
    sessions = [rare, popular, popular, popular]
    dictionary = build_dictionary(sessions, VOCAB, policy=DictionaryPolicy(max_tokens=40))
    assert dictionary.tokens.tolist() == popular
    assert len(dictionary) <= 40


@given(st.lists(st.lists(st.integers(0, 20), max_size=60), min_size=1, max_size=6),
       st.integers(2, 8))
def test_the_content_is_bounded_by_the_sample(sequences: list[list[int]], span: int) -> None:
    if not any(sequences):
        return
    dictionary = build_dictionary(sequences, 21, policy=DictionaryPolicy(dedupe_tokens=span))
    assert sum(dictionary.segment_lengths) == len(dictionary) <= sum(map(len, sequences))
    assert set(dictionary.tokens.tolist()) == {t for sequence in sequences for t in sequence}


def test_a_second_copy_of_the_sample_adds_nothing() -> None:
    sequences = _sequences()
    assert build_dictionary(sequences + sequences, VOCAB).digest == build_dictionary(
        sequences, VOCAB).digest


def test_every_damaged_byte_string_is_refused() -> None:
    data = build_dictionary(_sequences(), VOCAB, namespace="x").to_bytes()
    for cut in range(len(data)):
        with pytest.raises(DictionaryError):
            Dictionary.from_bytes(data[:cut])
    rng = np.random.default_rng(0)
    for position in rng.choice(len(data), 64, replace=False):
        damaged = bytearray(data)
        damaged[position] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(DictionaryError):
            Dictionary.from_bytes(bytes(damaged))


def test_wrong_magic() -> None:
    data = Dictionary([1, 2], [2], VOCAB).to_bytes()
    with pytest.raises(NotADictionaryError):
        Dictionary.from_bytes(b"NOTA" + data[4:])


def test_truncated() -> None:
    data = Dictionary([1, 2], [2], VOCAB).to_bytes()
    with pytest.raises(TruncatedDictionaryError):
        Dictionary.from_bytes(data[:-1])


def test_truncated_header() -> None:
    data = Dictionary([1, 2], [2], VOCAB).to_bytes()
    with pytest.raises(TruncatedDictionaryError):
        Dictionary.from_bytes(data[:8])


def test_other_version() -> None:
    data = bytearray(Dictionary([1, 2], [2], VOCAB).to_bytes())
    data[4] = FORMAT_VERSION + 1
    with pytest.raises(UnsupportedDictionaryVersionError, match="1, 2"):
        Dictionary.from_bytes(bytes(data))


def test_trailing_bytes() -> None:
    data = Dictionary([1, 2], [2], VOCAB).to_bytes()
    with pytest.raises(CorruptDictionaryError):
        Dictionary.from_bytes(data + b"\0")


def test_checksum_mismatch() -> None:
    data = bytearray(Dictionary([1, 2], [2], VOCAB).to_bytes())
    data[-6] ^= 1  # a token byte
    with pytest.raises(CorruptDictionaryError, match="checksum"):
        Dictionary.from_bytes(bytes(data))


def test_another_dictionary_than_expected() -> None:
    one, other = Dictionary([1, 2], [2], VOCAB), Dictionary([1, 3], [2], VOCAB)
    with pytest.raises(DictionaryMismatchError):
        Dictionary.from_bytes(one.to_bytes(), expected=other.digest)


def test_errors_are_seqkv_errors() -> None:
    assert issubclass(DictionaryError, SeqKVError)


def test_tokens_outside_the_vocabulary() -> None:
    with pytest.raises(InvalidDictionaryInputError):
        build_dictionary([[1, 2, VOCAB]], VOCAB)


def test_no_tokens() -> None:
    with pytest.raises(InvalidDictionaryInputError):
        build_dictionary([[], []], VOCAB)


def test_segment_lengths_that_do_not_add_up() -> None:
    with pytest.raises(InvalidDictionaryInputError):
        Dictionary([1, 2, 3], [2], VOCAB)


def test_a_policy_without_room() -> None:
    with pytest.raises(InvalidDictionaryInputError):
        DictionaryPolicy(max_tokens=0)


def test_a_dedupe_span_below_two() -> None:
    with pytest.raises(InvalidDictionaryInputError):
        DictionaryPolicy(dedupe_tokens=1)


def test_wide_vocabularies_store_four_byte_tokens() -> None:
    dictionary = Dictionary([70_000, 1], [2], 100_000)
    again = Dictionary.from_bytes(dictionary.to_bytes())
    assert again.tokens.tolist() == [70_000, 1]
    assert dictionary.size_bytes == 10 + 6 + 1 + 2 * 4 + 4  # framing, sections, CRC

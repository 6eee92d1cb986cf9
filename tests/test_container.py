"""The .skv file (``seqkv.formats.skv``): compact formats 3 and 4, every kind of damage gets its own
clear error, old formats still read into the same coded session and upgrade without re-coding,
writes are atomic."""

from __future__ import annotations

import dataclasses
import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from legacy_files import LEGACY, LEGACY_TOKENS, assert_refused, must_decode_here
from seqkv import compress, decompress
from seqkv.descriptions import Descriptions
from seqkv.errors import (
    CorruptFileError,
    EmptyInputError,
    EnvironmentMismatchError,
    NotASeqKVFileError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from seqkv.formats.skv import (
    FORMAT_VERSION,
    LEVEL_IDS,
    read_skv,
    write_skv,
    write_skv_file,
)
from seqkv.levels import LEVELS
from seqkv.models import CausalLM
from seqkv.skv import decompress_tokens, upgrade

# Format-3 files written by the last release that wrote format 3 (tiny_random_llama(seed=0),
# LEGACY_TOKENS, level portable, with and without the KV given)
FORMAT_3 = Path(__file__).parent / "data" / "v3"
# Format-4 files written by the last release that wrote format 4 (the same model and tokens;
# levels portable with and without the KV given, and plain): read as their writer wrote them
FORMAT_4 = Path(__file__).parent / "data" / "v4"


@pytest.fixture(scope="module")
def skv_bytes(tiny_model: CausalLM) -> bytes:
    tokens = [3, 9, 27, 81, 243, 217]
    return compress(tiny_model, tokens, kv=tiny_model.prefill(tokens)).data


def _reframe(body: bytes) -> bytes:
    """``body`` with a fresh CRC: a structural change that damage detection cannot see."""
    return body + struct.pack("<I", zlib.crc32(body))


def _rewritten(data: bytes) -> bytes:
    """``data`` read into its coded session and written again in its own format."""
    read = read_skv(data)
    return write_skv(read.session, read.version).data


def test_round_trip_is_byte_identical(skv_bytes: bytes) -> None:
    assert _rewritten(skv_bytes) == skv_bytes


def test_the_framing_is_small(skv_bytes: bytes, tiny_model: CausalLM) -> None:
    result = compress(tiny_model, [3, 9, 27, 81, 243, 217],
                      kv=tiny_model.prefill([3, 9, 27, 81, 243, 217]))
    payload = result.sections["token_code"] + result.sections["residual_code"]
    assert len(result.data) == sum(result.sections.values())
    assert len(result.data) - payload <= 64


def test_every_level_has_a_file_id() -> None:
    assert set(LEVELS) <= set(LEVEL_IDS)


def test_empty_file(skv_bytes: bytes) -> None:
    with pytest.raises(EmptyInputError, match="empty"):
        read_skv(b"")


def test_not_an_skv_file() -> None:
    with pytest.raises(NotASeqKVFileError, match="magic"):
        read_skv(b"The quick brown fox jumps over the lazy dog")


def test_unknown_version_is_refused_by_name(skv_bytes: bytes) -> None:
    data = bytearray(skv_bytes)
    data[4] = 99
    with pytest.raises(UnsupportedVersionError, match=r"version 99.*1, 2, 3"):
        read_skv(bytes(data))


@given(st.data())
def test_every_truncation_is_reported_as_truncated(skv_bytes: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(5, len(skv_bytes) - 1))
    with pytest.raises(TruncatedFileError, match=r"truncated|ends"):
        read_skv(skv_bytes[:cut])


@given(st.data())
def test_every_flipped_byte_is_caught(skv_bytes: bytes, data: st.DataObject) -> None:
    position = data.draw(st.integers(6, len(skv_bytes) - 1))  # past magic, version, count
    damaged = bytearray(skv_bytes)
    damaged[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises((CorruptFileError, TruncatedFileError)):
        read_skv(bytes(damaged))


def test_trailing_bytes_are_corruption(skv_bytes: bytes) -> None:
    with pytest.raises(CorruptFileError, match="unexpected bytes"):
        read_skv(skv_bytes + b"\x00")


def test_malformed_header_with_valid_checksum_is_corruption(skv_bytes: bytes) -> None:
    body = bytearray(skv_bytes[:-4])
    lengths_end = 6 + 3  # three one-byte section lengths
    body[lengths_end + 1] = 200  # level id out of range
    with pytest.raises(CorruptFileError, match="level id"):
        read_skv(_reframe(bytes(body)))


def test_every_legacy_file_is_present() -> None:
    # The parametrized tests below would skip on an empty glob: a checkout without the files
    # (once lost to a .gitignore pattern) must fail here instead.
    assert sorted(p.name for p in LEGACY.glob("*.skv")) == [
        "v1-tokens.skv", "v2-ngram.skv", "v2-plain.skv", "v2-rows.skv", "v2-segments-3.skv",
        "v2-tokens-bitexact.skv", "v2-tokens.skv"]


@pytest.mark.parametrize("name", sorted(p.name for p in LEGACY.glob("*.skv")))
def test_files_of_formats_1_and_2_decode_exactly_or_refuse(tiny_model: CausalLM,
                                                           name: str) -> None:
    data = (LEGACY / name).read_bytes()
    assert read_skv(data).version in (1, 2)
    if must_decode_here(tiny_model, data):
        assert decompress(tiny_model, data).tokens == LEGACY_TOKENS
    else:
        assert_refused(tiny_model, data)


@pytest.mark.parametrize("name", ["v2-ngram.skv", "v2-plain.skv"])
def test_model_free_files_of_format_2_decode_their_tokens_on_any_machine(name: str) -> None:
    assert decompress_tokens((LEGACY / name).read_bytes()) == LEGACY_TOKENS


@pytest.mark.parametrize("name", sorted(p.name for p in LEGACY.glob("*.skv")))
def test_upgrade_rewrites_without_recoding(tiny_model: CausalLM, name: str,
                                           tmp_path: Path) -> None:
    data = (LEGACY / name).read_bytes()
    descriptions = Descriptions(tmp_path)
    upgraded = upgrade(data, descriptions, tiny_model)
    read = read_skv(upgraded)
    assert read.version == 4  # the format whose token code an old writer wrote: no floor
    assert read.session.token_code == read_skv(data).session.token_code
    assert len(data) - len(upgraded) > 800  # the JSON header
    decodes = must_decode_here(tiny_model, data)
    assert must_decode_here(tiny_model, upgraded) == decodes
    if decodes:
        assert decompress(tiny_model, upgraded).tokens == LEGACY_TOKENS
    else:
        assert_refused(tiny_model, upgraded, descriptions)  # the profile upgrade remembered
        with pytest.raises(EnvironmentMismatchError,
                           match=f"digest {read.session.profile_digest.hex()}, this machine"):
            decompress(tiny_model, upgraded)  # without it: named by digest
    assert upgrade(upgraded, descriptions) == upgraded
    legacy = read_skv(data).model
    assert legacy is not None
    assert descriptions.model(read.session.model_digest) == legacy


def test_atomic_write_replaces_whole_file(tmp_path: Path, skv_bytes: bytes) -> None:
    target = tmp_path / "session.skv"
    target.write_bytes(b"old contents")
    write_skv_file(target, skv_bytes)
    assert target.read_bytes() == skv_bytes
    assert [p.name for p in tmp_path.iterdir()] == ["session.skv"]


def test_failed_write_keeps_the_old_file(
    tmp_path: Path, skv_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "session.skv"
    target.write_bytes(b"old contents")

    def disk_full(_: int) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="no space"):
        write_skv_file(target, skv_bytes)
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["session.skv"]


def test_written_files_get_the_usual_permissions(tmp_path: Path, skv_bytes: bytes) -> None:
    target = tmp_path / "session.skv"
    write_skv_file(target, skv_bytes)
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_the_coded_session_holds_no_mutable_state(skv_bytes: bytes) -> None:
    session = read_skv(skv_bytes).session
    with pytest.raises(dataclasses.FrozenInstanceError):
        session.count = 1  # type: ignore[misc]


@pytest.mark.parametrize("name", ["v3-portable.skv", "v3-portable-no-kv-given.skv"])
def test_format_3_files_decode_and_are_written_back_as_format_3(tiny_model: CausalLM,
                                                                 name: str) -> None:
    data = (FORMAT_3 / name).read_bytes()
    read = read_skv(data)
    assert read.version == 3 and read.session.kv_digest is not None
    assert _rewritten(data) == data
    assert decompress(tiny_model, data).tokens == LEGACY_TOKENS


@pytest.mark.parametrize("name", ["v4-portable.skv", "v4-portable-no-kv-given.skv",
                                  "v4-plain.skv"])
def test_format_4_files_decode_and_are_written_back_as_format_4(tiny_model: CausalLM,
                                                                 name: str) -> None:
    data = (FORMAT_4 / name).read_bytes()
    read = read_skv(data)
    assert read.version == 4 and read.session.code_form == "trimmed"
    assert _rewritten(data) == data
    assert decompress(tiny_model, data).tokens == LEGACY_TOKENS
    if name == "v4-plain.skv":
        assert decompress_tokens(data) == LEGACY_TOKENS


def _no_kv_file(tiny_model: CausalLM) -> bytes:
    return compress(tiny_model, LEGACY_TOKENS, level="portable").data


def test_a_portable_file_coded_without_its_kv_has_no_kv_digest(
        tiny_model: CausalLM) -> None:
    data = _no_kv_file(tiny_model)
    read = read_skv(data)
    assert read.version == FORMAT_VERSION == 5
    assert read.session.kv_digest is None and read.session.residual is None
    assert _rewritten(data) == data
    with_digest = compress(tiny_model, LEGACY_TOKENS, level="portable", record_kv=True).data
    assert len(with_digest) == len(data) + 8  # the KV digest, and nothing else


def _with_header_byte(data: bytes, index: int, value: int, version: int | None = None) -> bytes:
    body = bytearray(data[:-4])
    body[6 + 2 + index] = value  # after magic, version, count and two one-byte section lengths
    if version is not None:
        body[4] = version
    return _reframe(bytes(body))


def test_the_no_kv_flag_is_corruption_in_format_3_and_at_float_levels(
        tiny_model: CausalLM) -> None:
    data = _no_kv_file(tiny_model)
    flags = data[8]
    assert flags & 0b10000 and len(read_skv(data).session.level) > 0
    with pytest.raises(CorruptFileError, match="unknown flags 0x10 for format 3"):
        read_skv(_with_header_byte(data, 0, flags, version=3))
    with pytest.raises(CorruptFileError, match="only a portable level may omit, not rows"):
        read_skv(_with_header_byte(data, 1, LEVEL_IDS.index("rows")))


def test_a_header_without_a_kv_digest_is_written_only_as_readers_accept_it(
        tiny_model: CausalLM) -> None:
    session = read_skv(compress(tiny_model, LEGACY_TOKENS, kv=tiny_model.prefill(
        LEGACY_TOKENS), level="portable").data).session
    with pytest.raises(ValueError, match="no residual"):
        write_skv(dataclasses.replace(session, kv_digest=None))
    rows = read_skv(compress(tiny_model, LEGACY_TOKENS, level="rows").data).session
    with pytest.raises(ValueError, match="of a portable level"):  # what no reader would accept
        write_skv(dataclasses.replace(rows, kv_digest=None))

"""The .skv container: compact formats 3 and 4, every kind of damage gets its own clear error, old
formats still read and upgrade without re-coding, writes are atomic."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv import compress, decompress
from seqkv.codec import upgrade
from seqkv.container import (
    FORMAT_VERSION,
    LEVEL_IDS,
    decode_container,
    encode_container,
    write_container_file,
)
from seqkv.descriptions import Descriptions
from seqkv.errors import (
    CorruptFileError,
    EmptyInputError,
    NotASeqKVFileError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from seqkv.levels import LEVELS
from seqkv.models import CausalLM

LEGACY = Path(__file__).parent / "data" / "legacy"
LEGACY_TOKENS = json.loads((LEGACY / "tokens.json").read_text())
# Format-3 files written by the last release that wrote format 3 (tiny_random_llama(seed=0),
# LEGACY_TOKENS, level portable, with and without the KV given)
FORMAT_3 = Path(__file__).parent / "data" / "v3"


@pytest.fixture(scope="module")
def skv_bytes(tiny_model: CausalLM) -> bytes:
    tokens = [3, 9, 27, 81, 243, 217]
    return compress(tiny_model, tokens, kv=tiny_model.prefill(tokens)).data


def _reframe(body: bytes) -> bytes:
    """``body`` with a fresh CRC: a structural change that damage detection cannot see."""
    return body + struct.pack("<I", zlib.crc32(body))


def test_round_trip_is_byte_identical(skv_bytes: bytes) -> None:
    assert encode_container(decode_container(skv_bytes)) == skv_bytes


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
        decode_container(b"")


def test_not_an_skv_file() -> None:
    with pytest.raises(NotASeqKVFileError, match="magic"):
        decode_container(b"The quick brown fox jumps over the lazy dog")


def test_unknown_version_is_refused_by_name(skv_bytes: bytes) -> None:
    data = bytearray(skv_bytes)
    data[4] = 99
    with pytest.raises(UnsupportedVersionError, match=r"version 99.*1, 2, 3"):
        decode_container(bytes(data))


@given(st.data())
def test_every_truncation_is_reported_as_truncated(skv_bytes: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(5, len(skv_bytes) - 1))
    with pytest.raises(TruncatedFileError, match=r"truncated|ends"):
        decode_container(skv_bytes[:cut])


@given(st.data())
def test_every_flipped_byte_is_caught(skv_bytes: bytes, data: st.DataObject) -> None:
    position = data.draw(st.integers(6, len(skv_bytes) - 1))  # past magic, version, count
    damaged = bytearray(skv_bytes)
    damaged[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises((CorruptFileError, TruncatedFileError)):
        decode_container(bytes(damaged))


def test_trailing_bytes_are_corruption(skv_bytes: bytes) -> None:
    with pytest.raises(CorruptFileError, match="unexpected bytes"):
        decode_container(skv_bytes + b"\x00")


def test_malformed_header_with_valid_checksum_is_corruption(skv_bytes: bytes) -> None:
    body = bytearray(skv_bytes[:-4])
    lengths_end = 6 + 3  # three one-byte section lengths
    body[lengths_end + 1] = 200  # level id out of range
    with pytest.raises(CorruptFileError, match="level id"):
        decode_container(_reframe(bytes(body)))


def test_every_legacy_file_is_present() -> None:
    # The parametrized tests below would skip on an empty glob: a checkout without the files
    # (once lost to a .gitignore pattern) must fail here instead.
    assert sorted(p.name for p in LEGACY.glob("*.skv")) == [
        "v1-tokens.skv", "v2-ngram.skv", "v2-plain.skv", "v2-rows.skv", "v2-segments-3.skv",
        "v2-tokens-bitexact.skv", "v2-tokens.skv"]


@pytest.mark.parametrize("name", sorted(p.name for p in LEGACY.glob("*.skv")))
def test_files_of_formats_1_and_2_still_decode(tiny_model: CausalLM, name: str) -> None:
    data = (LEGACY / name).read_bytes()
    assert decode_container(data).header.format_version in (1, 2)
    assert decompress(tiny_model, data).tokens == LEGACY_TOKENS


@pytest.mark.parametrize("name", sorted(p.name for p in LEGACY.glob("*.skv")))
def test_upgrade_rewrites_without_recoding(tiny_model: CausalLM, name: str,
                                           tmp_path: Path) -> None:
    data = (LEGACY / name).read_bytes()
    descriptions = Descriptions(tmp_path)
    upgraded = upgrade(data, descriptions, tiny_model)
    container = decode_container(upgraded)
    assert container.header.format_version == FORMAT_VERSION
    assert container.token_code == decode_container(data).token_code
    assert len(data) - len(upgraded) > 800  # the JSON header
    old, new = decompress(tiny_model, data), decompress(tiny_model, upgraded)
    assert new.tokens == old.tokens == LEGACY_TOKENS
    assert new.kv.equal(old.kv)
    assert upgrade(upgraded, descriptions) == upgraded
    legacy = decode_container(data).header.legacy
    assert legacy is not None
    assert descriptions.model(container.header.model_digest) == legacy.model


def test_atomic_write_replaces_whole_file(tmp_path: Path, skv_bytes: bytes) -> None:
    target = tmp_path / "session.skv"
    target.write_bytes(b"old contents")
    write_container_file(target, skv_bytes)
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
        write_container_file(target, skv_bytes)
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["session.skv"]


def test_written_files_get_the_usual_permissions(tmp_path: Path, skv_bytes: bytes) -> None:
    target = tmp_path / "session.skv"
    write_container_file(target, skv_bytes)
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_the_header_dataclasses_hold_no_mutable_state(skv_bytes: bytes) -> None:
    header = decode_container(skv_bytes).header
    with pytest.raises(dataclasses.FrozenInstanceError):
        header.count = 1  # type: ignore[misc]


@pytest.mark.parametrize("name", ["v3-portable.skv", "v3-portable-no-kv-given.skv"])
def test_format_3_files_decode_and_are_written_back_as_format_3(tiny_model: CausalLM,
                                                                 name: str) -> None:
    data = (FORMAT_3 / name).read_bytes()
    container = decode_container(data)
    assert container.header.format_version == 3 and container.header.kv_digest is not None
    assert encode_container(container) == data
    assert decompress(tiny_model, data).tokens == LEGACY_TOKENS


def _no_kv_file(tiny_model: CausalLM) -> bytes:
    return compress(tiny_model, LEGACY_TOKENS, level="portable").data


def test_a_portable_file_coded_without_its_kv_is_format_4_without_a_kv_digest(
        tiny_model: CausalLM) -> None:
    data = _no_kv_file(tiny_model)
    container = decode_container(data)
    assert container.header.format_version == FORMAT_VERSION == 4
    assert container.header.kv_digest is None and container.residual is None
    assert encode_container(container) == data
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
    assert flags & 0b10000 and len(decode_container(data).header.level) > 0
    with pytest.raises(CorruptFileError, match="unknown flags 0x10 for format 3"):
        decode_container(_with_header_byte(data, 0, flags, version=3))
    with pytest.raises(CorruptFileError, match="only a portable level may omit, not rows"):
        decode_container(_with_header_byte(data, 1, LEVEL_IDS.index("rows")))


def test_a_header_without_a_kv_digest_is_written_only_as_readers_accept_it(
        tiny_model: CausalLM) -> None:
    container = decode_container(compress(tiny_model, LEGACY_TOKENS, kv=tiny_model.prefill(
        LEGACY_TOKENS), level="portable").data)
    header = dataclasses.replace(container.header, kv_digest=None)
    with pytest.raises(ValueError, match="no residual"):
        encode_container(dataclasses.replace(container, header=header))
    rows = decode_container(compress(tiny_model, LEGACY_TOKENS, level="rows").data)
    with pytest.raises(ValueError, match="of a portable level"):  # what no reader would accept
        encode_container(dataclasses.replace(
            rows, header=dataclasses.replace(rows.header, kv_digest=None)))

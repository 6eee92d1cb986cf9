"""The .skv container: every kind of damage gets its own clear error; writes are atomic."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv import compress
from seqkv.container import decode_container, encode_container, write_container_file
from seqkv.errors import (
    CorruptFileError,
    EmptyInputError,
    NotASeqKVFileError,
    TruncatedFileError,
    UnsupportedVersionError,
)
from seqkv.models import CausalLM


@pytest.fixture(scope="module")
def skv_bytes(tiny_model: CausalLM) -> bytes:
    tokens = [3, 9, 27, 81, 243, 217]
    return compress(tiny_model, tokens, kv=tiny_model.prefill(tokens)).data


def test_round_trip_is_byte_identical(skv_bytes: bytes) -> None:
    assert encode_container(decode_container(skv_bytes)) == skv_bytes


def test_empty_file(skv_bytes: bytes) -> None:
    with pytest.raises(EmptyInputError, match="empty"):
        decode_container(b"")


def test_not_an_skv_file() -> None:
    with pytest.raises(NotASeqKVFileError, match="magic"):
        decode_container(b"The quick brown fox jumps over the lazy dog")


def test_unknown_version(skv_bytes: bytes) -> None:
    data = bytearray(skv_bytes)
    struct.pack_into("<H", data, 8, 99)
    with pytest.raises(UnsupportedVersionError, match="version 99"):
        decode_container(bytes(data))


@given(st.data())
def test_every_truncation_is_reported_as_truncated(skv_bytes: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(8, len(skv_bytes) - 1))
    with pytest.raises(TruncatedFileError, match=r"truncated|ends after"):
        decode_container(skv_bytes[:cut])


@given(st.data())
def test_every_flipped_byte_is_caught(skv_bytes: bytes, data: st.DataObject) -> None:
    position = data.draw(st.integers(8 + 4, len(skv_bytes) - 1))  # past magic, version, reserved
    damaged = bytearray(skv_bytes)
    damaged[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises((CorruptFileError, TruncatedFileError)):
        decode_container(bytes(damaged))


def test_trailing_bytes_are_corruption(skv_bytes: bytes) -> None:
    with pytest.raises(CorruptFileError, match="unexpected bytes"):
        decode_container(skv_bytes + b"\x00")


def test_malformed_header_with_valid_checksum_is_corruption(skv_bytes: bytes) -> None:
    container = decode_container(skv_bytes)
    header = dataclasses.replace(container.header, writer="x")
    data = encode_container(dataclasses.replace(container, header=header))
    forged = data.replace(b'"writer": "x"', b'"writer_": 1 ')  # same length, unknown field
    body = forged[:-32]
    with pytest.raises(CorruptFileError, match="header"):
        decode_container(body + hashlib.sha256(body).digest())


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

"""Saving and loading a trie: round trip, lossless KV compression, atomic writes, damaged files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import EmptyInputError
from seqkv.kvcache import tensor_from_cache
from seqkv.models import CausalLM
from seqkv.trie import (
    CorruptTrieFileError,
    Namespace,
    NodeId,
    NodeInfo,
    NotATrieFileError,
    PrefixTrie,
    TruncatedTrieFileError,
    UnsupportedTrieVersionError,
    load_trie,
    save_trie,
    trie_from_bytes,
    trie_to_bytes,
)
from seqkv.trie.persistence import compress_kv, decompress_kv


def kv_for(tokens: list[int]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(sum(tokens))
    return torch.randn(2, 2, 3, len(tokens), 4, generator=gen)  # [L, 2, H, T, D]


def built_trie() -> PrefixTrie:
    trie = PrefixTrie(nominal_kv_bytes_per_token=7)
    a = [1, 2, 3, 4, 5]
    kv = kv_for(a)
    trie.insert(a, [-1.0, -0.5, -2.0, -0.25, -3.0], kv)
    trie.insert([1, 2, 3, 9], [-1.0, -0.5, -2.0, -4.0], torch.cat(
        [kv[:, :, :, :3], kv_for([9])], dim=3))
    trie.insert([7, 8], [-1.0, -1.0])  # no KV: nominal bytes
    trie.insert([1, 2], [-1.0, -0.5], namespace=Namespace("tenant"))
    trie.match([1, 2, 3, 4, 0])
    return trie


def comparable(info: NodeInfo) -> NodeInfo:
    """Ids are local to one trie object, and locks are not saved."""
    return dataclasses.replace(info, node_id=NodeId(0), ref_count=0)


@pytest.fixture(scope="module")
def trie_bytes() -> bytes:
    return trie_to_bytes(built_trie())


def test_round_trip(tmp_path: Path) -> None:
    trie = built_trie()
    report = save_trie(trie, tmp_path / "cache.trie")
    loaded = load_trie(tmp_path / "cache.trie")
    assert report.file_bytes == (tmp_path / "cache.trie").stat().st_size
    assert [comparable(n) for n in loaded.nodes()] == [comparable(n) for n in trie.nodes()]
    assert loaded.sessions() == ()
    assert loaded.sizes().protected_tokens == 0
    assert loaded.sizes().total_bytes == trie.sizes().total_bytes
    loaded.audit()
    for info in trie.nodes():
        want, got = trie.resolve(info.prefix_hash), loaded.resolve(info.prefix_hash)
        assert (got.tokens, got.log2_probs, got.namespace) == (
            want.tokens, want.log2_probs, want.namespace)
        assert (got.kv is None) == (want.kv is None)
        if got.kv is not None and want.kv is not None:
            assert torch.equal(got.kv, want.kv)


def test_a_loaded_trie_keeps_working(trie_bytes: bytes) -> None:
    loaded = trie_from_bytes(trie_bytes, budget_bytes=10**6, policy="probability")
    assert loaded.match([1, 2, 3, 9, 9]).length == 4
    assert loaded.insert([1, 2, 3, 4, 5, 6], [-1.0] * 6).hit_tokens == 5
    loaded.evict(10**9)
    loaded.audit()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_kv_compression_is_lossless(dtype: torch.dtype) -> None:
    kv = torch.randn(3, 2, 2, 5, 8).to(dtype)
    restored = decompress_kv(compress_kv(kv), tuple(kv.shape), dtype)
    assert restored.dtype == dtype
    assert torch.equal(restored.view(torch.uint8), kv.view(torch.uint8))  # bit for bit


def test_kv_compression_on_model_kv(tiny_model: CausalLM, tmp_path: Path) -> None:
    tokens = [(7 * i + 3) % tiny_model.vocab_size for i in range(64)]
    kv = tensor_from_cache(tiny_model.prefill(tokens))
    trie = PrefixTrie()
    trie.insert(tokens, [-1.0] * len(tokens), kv)
    report = save_trie(trie, tmp_path / "model.trie")
    assert report.kv_raw_bytes == kv.numel() * 4
    assert report.kv_compression_ratio < 1.0
    resolved = load_trie(tmp_path / "model.trie").match(tokens)
    assert resolved.kv is not None and torch.equal(resolved.kv, kv)


def test_save_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "cache.trie"
    target.write_bytes(b"old")
    save_trie(built_trie(), target)
    assert target.read_bytes()[:8] == b"\x89SKT\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.trie"]


def test_a_failed_save_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cache.trie"
    target.write_bytes(b"old")

    def crash(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        save_trie(built_trie(), target)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.trie"]


def test_empty_file() -> None:
    with pytest.raises(EmptyInputError, match="empty"):
        trie_from_bytes(b"")


def test_not_a_trie_file() -> None:
    with pytest.raises(NotATrieFileError, match="magic"):
        trie_from_bytes(b"The quick brown fox jumps over the lazy dog")


def test_unknown_version(trie_bytes: bytes) -> None:
    data = bytearray(trie_bytes)
    struct.pack_into("<H", data, 8, 99)
    with pytest.raises(UnsupportedTrieVersionError, match="version 99"):
        trie_from_bytes(bytes(data))


@given(st.data())
def test_every_truncation_is_reported_as_truncated(trie_bytes: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(8, len(trie_bytes) - 1))
    with pytest.raises(TruncatedTrieFileError, match=r"truncated|ends after"):
        trie_from_bytes(trie_bytes[:cut])


@given(st.data())
def test_every_flipped_byte_is_reported(trie_bytes: bytes, data: st.DataObject) -> None:
    position = data.draw(st.integers(12, len(trie_bytes) - 1))
    damaged = bytearray(trie_bytes)
    damaged[position] ^= 0x40
    with pytest.raises((CorruptTrieFileError, TruncatedTrieFileError)):
        trie_from_bytes(bytes(damaged))


def test_trailing_bytes(trie_bytes: bytes) -> None:
    with pytest.raises(CorruptTrieFileError, match="unexpected bytes"):
        trie_from_bytes(trie_bytes + b"\x00")


def test_an_inconsistent_file_with_a_valid_checksum(trie_bytes: bytes) -> None:
    header_len, payload_len = struct.unpack_from("<IQ", trie_bytes, 12)
    header = json.loads(trie_bytes[24 : 24 + header_len])
    header["nodes"][1]["parent"] = 5  # a parent after its child
    new_header = json.dumps(header).encode()
    payload = trie_bytes[24 + header_len : 24 + header_len + payload_len]
    body = struct.pack("<8sHHIQ", b"\x89SKT\r\n\x1a\n", 1, 0, len(new_header), payload_len)
    body += new_header + payload
    with pytest.raises(CorruptTrieFileError, match="inconsistent"):
        trie_from_bytes(body + hashlib.sha256(body).digest())

"""Saving and loading a trie: round trip, lossless KV compression, atomic writes, damaged files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import EmptyInputError
from seqkv.formats.framing import encode_varint, frame, unframe
from seqkv.kvcache import tensor_from_cache
from seqkv.limits import TRIE_LEGACY_HEADER_BYTES
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
    persistence,
    save_trie,
    trie_from_bytes,
    trie_to_bytes,
)
from seqkv.trie.errors import TrieFileError, TrieLimitError
from seqkv.trie.persistence import (
    _ERRORS,
    FORMAT_VERSION,
    LEGACY_MAGIC,
    MAGIC,
    compress_kv,
    decompress_kv,
    kv_inflate_limit,
)

LEGACY = Path(__file__).parent / "data" / "legacy"


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
    assert target.read_bytes()[:5] == MAGIC + bytes([FORMAT_VERSION])
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


def test_a_folder_is_refused_by_name(tmp_path: Path) -> None:
    """Issue 44: ``load_trie`` of a folder raised ``IsADirectoryError``."""
    with pytest.raises(TrieFileError, match=rf"{tmp_path} is a folder, not a trie file"):
        load_trie(tmp_path)


def test_empty_file() -> None:
    with pytest.raises(EmptyInputError, match="empty"):
        trie_from_bytes(b"")


def test_not_a_trie_file() -> None:
    with pytest.raises(NotATrieFileError, match="magic"):
        trie_from_bytes(b"The quick brown fox jumps over the lazy dog")


def test_unknown_version(trie_bytes: bytes) -> None:
    data = bytearray(trie_bytes)
    data[4] = 99
    with pytest.raises(UnsupportedTrieVersionError, match=r"version 99.*1, 2"):
        trie_from_bytes(bytes(data))


@given(st.data())
def test_every_truncation_is_reported_as_truncated(trie_bytes: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(4, len(trie_bytes) - 1))
    with pytest.raises(TruncatedTrieFileError, match=r"truncated|ends"):
        trie_from_bytes(trie_bytes[:cut])


@given(st.data())
def test_every_flipped_byte_is_reported(trie_bytes: bytes, data: st.DataObject) -> None:
    position = data.draw(st.integers(6, len(trie_bytes) - 1))  # past magic, version, count
    damaged = bytearray(trie_bytes)
    damaged[position] ^= 0x40
    with pytest.raises((CorruptTrieFileError, TruncatedTrieFileError)):
        trie_from_bytes(bytes(damaged))


def test_trailing_bytes(trie_bytes: bytes) -> None:
    with pytest.raises(CorruptTrieFileError, match="unexpected bytes"):
        trie_from_bytes(trie_bytes + b"\x00")


def test_save_load_save_is_byte_identical(trie_bytes: bytes) -> None:
    assert trie_to_bytes(trie_from_bytes(trie_bytes)) == trie_bytes


def test_files_of_format_1_still_load() -> None:
    # Written by seqkv at commit 7bbddf7 (the last writer of format 1) from ``built_trie()``.
    legacy = (LEGACY / "trie-v1.trie").read_bytes()
    assert legacy[:8] == LEGACY_MAGIC
    loaded = trie_from_bytes(legacy)
    assert [comparable(n) for n in loaded.nodes()] == [comparable(n) for n in
                                                        trie_from_bytes(trie_to_bytes(
                                                            built_trie())).nodes()]
    assert trie_to_bytes(loaded) == trie_to_bytes(built_trie())


def _sections(data: bytes) -> list[bytes]:
    return unframe(data, MAGIC, (FORMAT_VERSION,), _ERRORS, "test")[1]


def _reframed(sections: list[bytes]) -> bytes:
    """A file with a valid checksum around changed sections: damage detection cannot see it."""
    return frame(MAGIC, FORMAT_VERSION, sections)


def _with_probs(data: bytes, value: float) -> bytes:
    sections = _sections(data)
    probs = bytearray(sections[4])
    probs[:8] = struct.pack("<d", value)
    sections[4] = bytes(probs)
    return _reframed(sections)


@pytest.mark.parametrize("value", [float("nan"), 5.0, float("-inf"), float("inf")])
def test_log2_probabilities_must_be_finite_and_not_above_0(trie_bytes: bytes,
                                                           value: float) -> None:
    with pytest.raises(CorruptTrieFileError, match="log2-probability"):
        trie_from_bytes(_with_probs(trie_bytes, value))


def test_a_parent_after_its_child(trie_bytes: bytes) -> None:
    sections = _sections(trie_bytes)
    nodes = bytearray(sections[2])
    assert nodes[:2] == b"\x00\x00" and nodes[2] == 1  # a root, then a child of node 0
    nodes[2] = 6  # parent 5: not before node 1
    sections[2] = bytes(nodes)
    with pytest.raises(CorruptTrieFileError, match="node parent"):
        trie_from_bytes(_reframed(sections))


def test_statistics_after_the_clock(trie_bytes: bytes) -> None:
    sections = _sections(trie_bytes)
    header = bytearray(sections[0])
    header[0] = 0  # the clock back to 0: every node's creation is after it
    sections[0] = bytes(header)
    with pytest.raises(CorruptTrieFileError, match="after the trie's clock"):
        trie_from_bytes(_reframed(sections))


def test_kv_that_would_inflate_beyond_its_shape_is_refused_before_inflating() -> None:
    trie = PrefixTrie()
    trie.insert([1, 2], [-1.0, -1.0], torch.zeros(1, 2, 1, 2, 2))
    sections = _sections(trie_to_bytes(trie))
    bomb = zlib.compress(bytes(1 << 20), 9)  # 1 MiB of zeros in about 1 KB
    nodes = bytearray(sections[2])
    assert nodes[-4] == len(sections[5])  # the child's KV length
    nodes[-4:-3] = encode_varint(len(bomb))
    sections[2], sections[5] = bytes(nodes), bomb
    with pytest.raises(CorruptTrieFileError, match="inflates to more than the 32 bytes"):
        trie_from_bytes(_reframed(sections))


def test_a_bomb_within_zlib_s_ratio_is_refused_before_inflating() -> None:
    """A node of zeros that zlib can inflate (below its ~1,032x ratio) but no real KV compresses
    to: 8 MiB declared from 8 KB, refused by the file's KV cap before anything is inflated."""
    layout = (256, 2, 1, 64, 64)  # [L, 2, H, T, D]: 8 MiB of float32 for 64 tokens
    trie = PrefixTrie()
    trie.insert(list(range(1, 65)), [-1.0] * 64, torch.zeros(layout))
    data = trie_to_bytes(trie)
    compressed = len(_sections(data)[5])
    assert 4 * math.prod(layout) > kv_inflate_limit(compressed)  # the cap, not zlib's, refuses
    assert 4 * math.prod(layout) < 1032 * compressed
    with pytest.raises(TrieLimitError, match="bomb"):
        trie_from_bytes(data)


@pytest.mark.parametrize("level", [0, 1, 9])
def test_a_node_deflated_at_another_level_saves_back_byte_identical(level: int) -> None:
    """Another zlib level (or build) gives other bytes for the same KV: the loaded node keeps
    the bytes it was loaded from, so load -> save gives the file back; a split drops them."""
    trie = PrefixTrie()
    kv = torch.randn(1, 2, 1, 4, 2, generator=torch.Generator().manual_seed(0))
    trie.insert([1, 2, 3, 4], [-1.0] * 4, kv)
    sections = _sections(trie_to_bytes(trie))
    planes = zlib.decompress(sections[5])
    other = zlib.compress(planes, level)
    assert other != sections[5]
    nodes = bytearray(sections[2])
    assert nodes[-4] == len(sections[5])  # the child's KV length
    nodes[-4:-3] = encode_varint(len(other))
    sections[2], sections[5] = bytes(nodes), other
    data = _reframed(sections)
    loaded = trie_from_bytes(data)
    assert trie_to_bytes(loaded) == data
    loaded.insert([1, 2, 9], [-1.0] * 3, torch.zeros(1, 2, 1, 3, 2))  # splits the node
    assert _sections(trie_to_bytes(loaded))[5] != other


def test_kv_larger_than_zlib_can_inflate_is_refused_unread() -> None:
    with pytest.raises(CorruptTrieFileError, match="cannot inflate"):
        decompress_kv(b"x" * 10, (1024, 2, 64, 64, 64), torch.float32)


def test_a_tree_that_costs_more_than_its_size_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    trie = PrefixTrie()
    for length in range(1, 40):  # a chain of one-token nodes: path work grows as length**2
        trie.insert(list(range(1, length + 1)), [-1.0] * length)
    data = trie_to_bytes(trie)
    monkeypatch.setattr(persistence, "TRIE_PATH_WORK_BASE", 0)
    monkeypatch.setattr(persistence, "TRIE_PATH_WORK_PER_BYTE", 0)
    with pytest.raises(TrieLimitError, match="path hashing"):
        trie_from_bytes(data)
    monkeypatch.setattr(persistence, "TRIE_PATH_WORK_BASE", 39 * 40 // 2)
    assert len(trie_from_bytes(data).nodes()) == 40


def _legacy_with(change: Callable[[dict[str, Any], bytearray], None],
                 splice: tuple[bytes, bytes] = (b"", b"")) -> bytes:
    """The format-1 fixture with its JSON header (and payload) changed, ``splice[0]`` replaced
    by ``splice[1]`` in the header's text, SHA-256 recomputed."""
    data = (LEGACY / "trie-v1.trie").read_bytes()
    header_len, payload_len = struct.unpack_from("<IQ", data, 12)
    header = json.loads(data[24 : 24 + header_len])
    payload = bytearray(data[24 + header_len : 24 + header_len + payload_len])
    change(header, payload)
    raw = json.dumps(header).encode()
    if splice[0]:
        raw = raw.replace(splice[0], splice[1])
    body = struct.pack("<8sHHIQ", LEGACY_MAGIC, 1, 0, len(raw), len(payload)) + raw + payload
    return body + hashlib.sha256(body).digest()


def test_format_1_an_inconsistent_file_with_a_valid_checksum() -> None:
    def parent_after_child(header: dict[str, Any], _: bytearray) -> None:
        header["nodes"][1]["parent"] = 5

    with pytest.raises(CorruptTrieFileError, match="parent"):
        trie_from_bytes(_legacy_with(parent_after_child))


def test_format_1_negative_token_ids() -> None:
    def negative(_: dict[str, Any], payload: bytearray) -> None:
        payload[:8] = struct.pack("<q", -3)

    with pytest.raises(CorruptTrieFileError, match="negative token"):
        trie_from_bytes(_legacy_with(negative))


def test_format_1_negative_hit_counts() -> None:
    def negative(header: dict[str, Any], _: bytearray) -> None:
        header["nodes"][1]["hit_count"] = -1

    with pytest.raises(CorruptTrieFileError, match="hit_count"):
        trie_from_bytes(_legacy_with(negative))


def test_format_1_deep_nesting_is_refused_before_parsing() -> None:
    def nested(header: dict[str, Any], _: bytearray) -> None:
        header["writer"] = "@nested@"

    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(CorruptTrieFileError, match="deeper"):
        trie_from_bytes(_legacy_with(nested, (b'"@nested@"', deep)))


def test_format_1_a_header_over_its_cap_is_refused_unparsed() -> None:
    """A long escaped string was quadratic for the old pre-parse guard; any header beyond the
    cap is refused by its size alone, in time linear in nothing but its length."""
    def long(header: dict[str, Any], _: bytearray) -> None:
        header["writer"] = "@long@"

    quotes = b'"' + b'\\"' * (TRIE_LEGACY_HEADER_BYTES // 2) + b'"'
    with pytest.raises(CorruptTrieFileError, match="more than the"):
        trie_from_bytes(_legacy_with(long, (b'"@long@"', quotes)))


def test_format_1_trailing_payload_bytes() -> None:
    def extra(_: dict[str, Any], payload: bytearray) -> None:
        payload += b"\x00"

    with pytest.raises(CorruptTrieFileError, match="no node claims"):
        trie_from_bytes(_legacy_with(extra))

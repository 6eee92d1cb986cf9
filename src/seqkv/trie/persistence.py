"""Saving and loading a ``PrefixTrie``: one crash-safe file, node KV compressed losslessly.

Format 2 (the format written) frames six sections with ``seqkv.formats.framing`` (4-byte
magic ``\\x89SKT``, version byte, section lengths, CRC-32); integers are minimal LEB128 varints::

    header      clock, nominal KV bytes per token, node count     varints
                token width                                       u8   4 or 8 bytes
                KV layout flag                                    u8   0 none, 1 present
                [layers, kv_heads, head_dim]                      varints
                [dtype]                                           u8   ``DTYPES`` index
                KV compression                                    u8   0: byte planes + zlib
    namespaces  count, then per namespace its UTF-8 length and bytes, in order of first use
    nodes       pre-order, roots first in their subtree, children by ascending first token;
                a root: 0, namespace index; any other node: parent index + 1, edge length,
                compressed KV length (0: no KV), hit count, last access, created
    tokens      every edge's tokens, in node order, unsigned little-endian of the token width
    log2 probs  one float64 per token, in node order
    kv          every node's compressed KV, in node order

Files of format 1 (an 8-byte magic, a JSON header, a SHA-256) still load. Roots carry no
statistics in format 2: a loaded trie restarts them (``PrefixTrie.from_snapshot``), so a trie
saved, loaded and saved again gives the same bytes.

KV compression: the float bytes of each node's span are split into byte planes (all first bytes,
then all second bytes, ...) and deflated with zlib level 6, which is lossless: on the float32
KV of one prefill of ``src/seqkv/data/sample.txt`` by the embedded SmolLM2-135M, byte planes +
zlib give 0.845 of the size, plain zlib 0.923, lzma preset 6 0.916 at many times the time.
Float mantissas are close to incompressible, so expect no more than ~15%. The tests check
the round trip bit for bit and that the ratio is below 1 (0.87 on the tiny test model's KV).

Invariants:
1. ``save_trie`` writes a temporary file beside the target, flushes and fsyncs it, then renames it
   over the target: an existing file is replaced whole or not at all (enforced).
2. ``load_trie`` checks, in order, emptiness, magic, version, length and checksum before it
   parses anything, so each kind of damage gets its own error: EmptyInputError,
   NotATrieFileError, UnsupportedTrieVersionError, TruncatedTrieFileError, CorruptTrieFileError
   (enforced; one test each).
3. Every field is validated before anything is allocated by its size: counts against the
   sections' lengths, the tree's shape (parents before children, pre-order, one child per first
   token, namespaces inherited), tokens (>= 0, the minimal width), log2-probabilities (finite,
   <= 0), statistics (<= the clock), the KV layout, each node's KV size against its
   compressed size (zlib inflates at most ``TRIE_ZLIB_MAX_RATIO`` times) and the file's KV sizes
   together against its KV bytes (``kv_inflate_limit``) before anything is inflated, streaming,
   with the node's size as a cap. A format-1 JSON header is parsed only below
   ``TRIE_LEGACY_HEADER_BYTES``. A crafted file with a valid checksum ends in a ``TrieFileError``
   (enforced; ``tests/test_fuzz_trie.py``).
4. Loading costs at most ``path_work_limit(file bytes)`` token positions of path hashing, the
   loader's one cost beyond the file's size (every node hashes its whole path); a file whose
   tree would cost more is refused before the trie is built (TrieLimitError, enforced).
5. ``trie_to_bytes(trie_from_bytes(d)) == d`` for any bytes ``d`` of format 2 that load
   (enforced by the canonical form of invariant 3, and by each node keeping the compressed KV it
   was loaded from, saved back as it was whatever zlib level or build deflated it; checked by
   the fuzz suite and ``tests/test_trie_persistence.py``).
6. Prefix hashes are not stored: the loader recomputes every node's hash from its tokens, so a
   loaded trie resolves exactly the hashes the saved one did (checked).
7. Sessions (locks) are not saved: a loaded trie has none, every node is evictable (enforced).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from seqkv.errors import EmptyInputError
from seqkv.eviction import EvictionPolicy, EvictionPolicyName
from seqkv.files import write_atomically
from seqkv.formats.framing import (
    FramingErrors,
    SectionReader,
    encode_varint,
    frame,
    inflate,
    load_json,
    unframe,
)
from seqkv.limits import (
    MAX_HEAD_DIM,
    MAX_KV_HEADS,
    MAX_LAYERS,
    MAX_VARINT,
    TRIE_KV_INFLATE_SLACK,
    TRIE_KV_MAX_RATIO,
    TRIE_LEGACY_HEADER_BYTES,
    TRIE_LEGACY_HEADER_DEPTH,
    TRIE_PATH_WORK_BASE,
    TRIE_PATH_WORK_PER_BYTE,
    TRIE_ZLIB_MAX_RATIO,
)
from seqkv.trie.errors import (
    CorruptTrieFileError,
    NotATrieFileError,
    TrieFileError,
    TrieLimitError,
    TruncatedTrieFileError,
    UnsupportedTrieVersionError,
)
from seqkv.trie.inputs import KVLayout
from seqkv.trie.keys import Namespace
from seqkv.trie.node import TrieNode
from seqkv.trie.radix import NodeRecord, PrefixTrie, TrieSnapshot

MAGIC = b"\x89SKT"
LEGACY_MAGIC = b"\x89SKT\r\n\x1a\n"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
KV_COMPRESSION = "byteplanes+zlib6"
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
_TORCH_DTYPES = MappingProxyType({
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
})
_ERRORS = FramingErrors(EmptyInputError, NotATrieFileError, UnsupportedTrieVersionError,
                        TruncatedTrieFileError, CorruptTrieFileError)
_WHAT = "the trie file"
_ZLIB_LEVEL = 6
_SECTIONS = 6


def kv_inflate_limit(kv_bytes: int) -> int:
    """The most bytes a file's ``kv_bytes`` of compressed KV may inflate to, all nodes
    together."""
    return TRIE_KV_MAX_RATIO * kv_bytes + TRIE_KV_INFLATE_SLACK


def path_work_limit(file_bytes: int) -> int:
    """The most token positions of path hashing a file of ``file_bytes`` may ask for."""
    return TRIE_PATH_WORK_BASE + TRIE_PATH_WORK_PER_BYTE * file_bytes


@dataclass(frozen=True, slots=True)
class SaveReport:
    """What ``save_trie`` wrote."""

    path: Path
    file_bytes: int
    nodes: int
    tokens: int
    kv_raw_bytes: int
    kv_compressed_bytes: int

    @property
    def kv_compression_ratio(self) -> float:
        """Compressed over raw KV bytes (1.0 when no KV is held)."""
        return self.kv_compressed_bytes / self.kv_raw_bytes if self.kv_raw_bytes else 1.0


def save_trie(trie: PrefixTrie, path: str | os.PathLike[str]) -> SaveReport:
    """Write ``trie`` to ``path`` atomically (temporary file, fsync, rename)."""
    target = Path(path)
    data, raw, compressed, snapshot = _encode(trie.snapshot())
    write_atomically(target, data)
    return SaveReport(
        path=target, file_bytes=len(data), nodes=len(snapshot.records),
        tokens=sum(len(r.tokens) for r in snapshot.records), kv_raw_bytes=raw,
        kv_compressed_bytes=compressed,
    )


def load_trie(
    path: str | os.PathLike[str],
    *,
    budget_bytes: int | None = None,
    policy: EvictionPolicy[TrieNode] | EvictionPolicyName = "lru",
) -> PrefixTrie:
    """Read a trie ``save_trie`` wrote; each kind of damage raises its own error (a folder
    at ``path``: ``TrieFileError`` naming it)."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise TrieFileError(f"{os.fspath(path)} is a folder, not a trie file: pass the file "
                            "save_trie wrote") from None
    return trie_from_bytes(data, budget_bytes=budget_bytes, policy=policy)


def trie_to_bytes(trie: PrefixTrie) -> bytes:
    """The file ``save_trie`` would write, in memory."""
    return _encode(trie.snapshot())[0]


def trie_from_bytes(
    data: bytes,
    *,
    budget_bytes: int | None = None,
    policy: EvictionPolicy[TrieNode] | EvictionPolicyName = "lru",
) -> PrefixTrie:
    snapshot = _decode(data)
    try:
        return PrefixTrie.from_snapshot(snapshot, budget_bytes=budget_bytes, policy=policy)
    except ValueError as error:
        raise CorruptTrieFileError(f"the trie file is inconsistent: {error}") from error


def compress_kv(kv: torch.Tensor) -> bytes:
    """Lossless: the tensor's bytes split into byte planes, then zlib."""
    itemsize = kv.element_size()
    raw = kv.contiguous().reshape(-1).view(torch.uint8).numpy()  # [numel * itemsize]
    planes = raw.reshape(-1, itemsize).T  # [itemsize, numel]
    return zlib.compress(np.ascontiguousarray(planes).tobytes(), _ZLIB_LEVEL)


def decompress_kv(data: bytes, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``compress_kv``; CorruptTrieFileError when the bytes do not fit the shape
    (inflated streaming, never past the shape's size)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = math.prod(shape)
    size = numel * itemsize
    if size > TRIE_ZLIB_MAX_RATIO * len(data) + 64:
        raise CorruptTrieFileError(f"a KV section of {len(data):,} bytes cannot inflate to the "
                                   f"{size:,} bytes of its shape {list(shape)}")
    raw = inflate(data, size, "a KV section", CorruptTrieFileError)
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(itemsize, numel)  # [itemsize, numel]
    interleaved = np.empty((numel, itemsize), dtype=np.uint8)  # [numel, itemsize]
    interleaved[...] = planes.T
    del raw, planes
    return torch.from_numpy(interleaved.reshape(-1)).view(dtype).reshape(shape)  # [L,2,H,T,D]


def _encode(snapshot: TrieSnapshot) -> tuple[bytes, int, int, TrieSnapshot]:
    namespaces: dict[str, int] = {}
    nodes = bytearray()
    blobs: list[bytes] = []
    raw = 0
    for record in snapshot.records:
        if record.parent == -1:
            index = namespaces.setdefault(record.namespace, len(namespaces))
            nodes += encode_varint(0) + encode_varint(index)
            continue
        blob = b""
        if record.kv is not None:
            blob = record.kv_bytes if record.kv_bytes is not None else compress_kv(record.kv)
            raw += record.kv.numel() * record.kv.element_size()
            blobs.append(blob)
        for value in (record.parent + 1, len(record.tokens), len(blob), record.hit_count,
                      record.last_access, record.created):
            nodes += encode_varint(value)
    tokens = np.concatenate([np.zeros(0, dtype=np.int64), *(r.tokens for r in snapshot.records)])
    width = 8 if tokens.size and int(tokens.max()) >= 1 << 32 else 4
    probs = np.concatenate([np.zeros(0, dtype=np.float64),
                            *(r.log2_probs for r in snapshot.records)])
    layout = snapshot.kv_layout
    header = bytearray()
    for value in (snapshot.clock, snapshot.nominal_kv_bytes_per_token, len(snapshot.records)):
        header += encode_varint(value)
    header += bytes([width, 0 if layout is None else 1])
    if layout is not None:
        for value in (layout.layers, layout.kv_heads, layout.head_dim):
            header += encode_varint(value)
        header.append(DTYPES.index(str(layout.dtype).removeprefix("torch.")))
    header.append(0)  # KV_COMPRESSION
    names = bytearray(encode_varint(len(namespaces)))
    for name in namespaces:
        encoded = name.encode("utf-8")
        names += encode_varint(len(encoded)) + encoded
    sections = [bytes(header), bytes(names), bytes(nodes),
                tokens.astype("<u4" if width == 4 else "<u8").tobytes(),
                probs.astype("<f8").tobytes(), b"".join(blobs)]
    compressed = len(sections[5])
    return frame(MAGIC, FORMAT_VERSION, sections), raw, compressed, snapshot


@dataclass(frozen=True, slots=True)
class _Node:
    """One node as a file declares it, before its tokens, probabilities and KV are attached."""

    parent: int  # -1 for a root
    namespace: str
    tokens: int
    kv: tuple[int, int] | None  # (offset, length) in the KV bytes
    hit_count: int
    last_access: int
    created: int


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A file's fields, each checked on its own, before the tree is checked as a whole."""

    clock: int
    nominal: int
    layout: KVLayout | None
    nodes: list[_Node]
    tokens: npt.NDArray[np.int64]
    log2_probs: npt.NDArray[np.float64]
    kv: bytes
    canonical: bool  # format 2: the node order, token width and extents are the writer's


def _corrupt(message: str) -> CorruptTrieFileError:
    return CorruptTrieFileError(f"the trie file {message}")


def _decode(data: bytes) -> TrieSnapshot:
    if len(data) >= len(LEGACY_MAGIC) and data[: len(LEGACY_MAGIC)] == LEGACY_MAGIC:
        parsed = _read_legacy(data)
    else:
        parsed = _read(data)
    return _assemble(parsed, len(data))


def _layout(layers: int, kv_heads: int, head_dim: int, dtype: str) -> KVLayout:
    return KVLayout(layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                    dtype=_TORCH_DTYPES[dtype])


def _read(data: bytes) -> _Parsed:
    _, sections = unframe(data, MAGIC, (FORMAT_VERSION,), _ERRORS, _WHAT, READABLE_VERSIONS)
    if len(sections) != _SECTIONS:
        raise _corrupt(f"has {len(sections)} sections, not {_SECTIONS}")
    header = SectionReader(sections[0], "the trie file's header", CorruptTrieFileError)
    clock = header.varint("clock")
    nominal = header.varint("nominal KV bytes per token")
    count = header.varint("node count", 0, len(sections[2]) // 2)
    width = header.u8("token width")
    if width not in (4, 8):
        raise _corrupt(f"has token width {width}, not 4 or 8")
    has_layout = header.u8("KV layout flag")
    if has_layout > 1:
        raise _corrupt(f"has KV layout flag {has_layout}, not 0 or 1")
    layout = None
    if has_layout:
        layers = header.varint("layer count", 1, MAX_LAYERS)
        heads = header.varint("KV head count", 1, MAX_KV_HEADS)
        head_dim = header.varint("head dimension", 1, MAX_HEAD_DIM)
        dtype = header.u8("dtype")
        if dtype >= len(DTYPES):
            raise _corrupt(f"has unknown dtype id {dtype}")
        layout = _layout(layers, heads, head_dim, DTYPES[dtype])
    compression = header.u8("KV compression")
    if compression != 0:
        raise _corrupt(f"has unknown KV compression id {compression}")
    header.finish()
    names_reader = SectionReader(sections[1], "the trie file's namespaces",
                                 CorruptTrieFileError)
    names: list[str] = []
    for _ in range(names_reader.varint("namespace count", 0, len(sections[1]))):
        raw = names_reader.take(names_reader.varint("namespace length"), "namespace")
        try:
            names.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise _corrupt(f"holds a namespace that is not UTF-8: {error}") from None
    names_reader.finish()
    if len(set(names)) != len(names):
        raise _corrupt("lists a namespace twice")
    nodes = _read_nodes(SectionReader(sections[2], "the trie file's nodes", CorruptTrieFileError),
                        count, names, len(sections[5]))
    total = sum(node.tokens for node in nodes)
    if len(sections[3]) != width * total or len(sections[4]) != 8 * total:
        raise _corrupt(f"declares {total:,} tokens, but its token and log2-probability sections "
                       f"hold {len(sections[3]):,} and {len(sections[4]):,} bytes")
    if sum(node.kv[1] for node in nodes if node.kv is not None) != len(sections[5]):
        raise _corrupt("has KV bytes that no node claims")
    raw_tokens = np.frombuffer(sections[3], dtype="<u4" if width == 4 else "<u8")
    if width == 8 and raw_tokens.size and int(raw_tokens.max()) < 1 << 32:
        raise _corrupt("stores 8-byte tokens that all fit in 4 bytes")
    if width == 8 and raw_tokens.size and int(raw_tokens.max()) >= 1 << 63:
        raise _corrupt("holds a token id of 2**63 or more")
    return _Parsed(clock, nominal, layout, nodes, raw_tokens.astype(np.int64),
                   np.frombuffer(sections[4], dtype="<f8").astype(np.float64), sections[5],
                   canonical=True)


def _read_nodes(reader: SectionReader, count: int, names: list[str],
                kv_bytes: int) -> list[_Node]:
    nodes: list[_Node] = []
    offset = 0
    for index in range(count):
        parent = reader.varint("node parent", 0, index) - 1
        if parent == -1:
            namespace = reader.varint("root namespace", 0, len(names) - 1)
            nodes.append(_Node(-1, names[namespace], 0, None, 0, 0, 0))
            continue
        tokens = reader.varint("edge length", 1)
        length = reader.varint("KV length", 0, kv_bytes - offset)
        kv = None if length == 0 else (offset, length)
        offset += length
        hit_count = reader.varint("hit count")
        last_access = reader.varint("last access")
        created = reader.varint("creation time")
        nodes.append(_Node(parent, nodes[parent].namespace, tokens, kv, hit_count, last_access,
                           created))
    reader.finish()
    used = {node.namespace for node in nodes if node.parent == -1}
    if len(used) != len(names):
        raise _corrupt("lists a namespace no root uses")
    return nodes


def _read_legacy(data: bytes) -> _Parsed:
    """A format-1 file: 8-byte magic, u16 version, u16 reserved, u32 header length, u64 payload
    length, JSON header, payload (tokens as i64, log2-probabilities as f64, compressed KV),
    SHA-256 of everything before it."""
    prefix = struct.Struct("<8sHHIQ")
    if len(data) < prefix.size:
        raise TruncatedTrieFileError(f"the trie file ends after {len(data)} bytes, in its prefix")
    _, version, reserved, header_len, payload_len = prefix.unpack_from(data)
    if version != 1:
        raise UnsupportedTrieVersionError(
            f"the trie file has format version {version}; this seqkv reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}: use the seqkv release that wrote it")
    expected = prefix.size + header_len + payload_len + 32
    if len(data) < expected:
        raise TruncatedTrieFileError(
            f"the trie file is truncated: it has {len(data)} bytes, its prefix says {expected}")
    if len(data) > expected:
        raise _corrupt(f"has {len(data) - expected} unexpected bytes after its end")
    body, digest = data[:-32], data[-32:]
    if hashlib.sha256(body).digest() != digest:
        raise _corrupt("is corrupted: its SHA-256 checksum does not match")
    if reserved:
        raise _corrupt(f"has reserved field {reserved}, not 0")
    header = load_json(body[prefix.size : prefix.size + header_len], "the trie file's header",
                       CorruptTrieFileError, TRIE_LEGACY_HEADER_BYTES, TRIE_LEGACY_HEADER_DEPTH)
    payload = body[prefix.size + header_len :]
    return _parse_legacy(header, payload)


def _field(raw: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(raw, dict) or key not in raw:
        raise _corrupt(f"header lacks {where}{key}")
    value = raw[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)
                        or not 0 <= value <= MAX_VARINT):
        raise _corrupt(f"header's {where}{key} is not an integer in [0, 2**56): {value!r:.40}")
    if kind is not int and not isinstance(value, kind):
        raise _corrupt(f"header's {where}{key} is not a {kind.__name__}: {value!r:.40}")
    return value


def _parse_legacy(header: Any, payload: bytes) -> _Parsed:
    keys = {"format_version", "writer", "clock", "nominal_kv_bytes_per_token", "kv_layout",
            "kv_compression", "nodes"}
    if not isinstance(header, dict) or set(header) != keys:
        raise _corrupt(f"header's fields differ from {sorted(keys)}")
    if header["format_version"] != 1 or header["kv_compression"] != KV_COMPRESSION:
        raise _corrupt("header names another version or KV compression")
    _field(header, "writer", str, "")
    layout = None
    if header["kv_layout"] is not None:
        raw = header["kv_layout"]
        if not isinstance(raw, dict) or set(raw) != {"layers", "kv_heads", "head_dim", "dtype"}:
            raise _corrupt("header's kv_layout is malformed")
        numbers = [_field(raw, key, int, "kv_layout.") for key in ("layers", "kv_heads",
                                                                   "head_dim")]
        bounds = (MAX_LAYERS, MAX_KV_HEADS, MAX_HEAD_DIM)
        if not all(1 <= n <= high for n, high in zip(numbers, bounds, strict=True)):
            raise _corrupt(f"header's kv_layout {numbers} is out of range")
        dtype = _field(raw, "dtype", str, "kv_layout.")
        if dtype not in DTYPES:
            raise _corrupt(f"header names an unknown dtype {dtype!r:.40}")
        layout = _layout(numbers[0], numbers[1], numbers[2], dtype)
    node_keys = {"parent", "namespace", "tokens", "kv", "hit_count", "last_access", "created"}
    raw_nodes = _field(header, "nodes", list, "")
    nodes: list[_Node] = []
    for index, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict) or set(raw) != node_keys:
            raise _corrupt(f"header's node {index} is malformed")
        parent = raw["parent"]
        if parent != -1:
            parent = _field(raw, "parent", int, f"nodes[{index}].")
        extent = raw["kv"]
        kv = None
        if extent is not None:
            if (not isinstance(extent, list) or len(extent) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                               for v in extent)):
                raise _corrupt(f"header's node {index} has a malformed KV extent")
            kv = (extent[0], extent[1])
        nodes.append(_Node(
            parent, _field(raw, "namespace", str, f"nodes[{index}]."),
            _field(raw, "tokens", int, f"nodes[{index}]."), kv,
            _field(raw, "hit_count", int, f"nodes[{index}]."),
            _field(raw, "last_access", int, f"nodes[{index}]."),
            _field(raw, "created", int, f"nodes[{index}].")))
    total = sum(node.tokens for node in nodes)
    if len(payload) < 16 * total:
        raise _corrupt("payload is shorter than its tokens and log2-probabilities")
    tokens = np.frombuffer(payload, dtype="<i8", count=total)
    if total and int(tokens.min()) < 0:
        raise _corrupt("holds a negative token id")
    probs = np.frombuffer(payload, dtype="<f8", count=total, offset=8 * total)
    return _Parsed(_field(header, "clock", int, ""),
                   _field(header, "nominal_kv_bytes_per_token", int, ""), layout, nodes,
                   tokens.astype(np.int64), probs.astype(np.float64), payload[16 * total :],
                   canonical=False)


def _assemble(parsed: _Parsed, file_bytes: int) -> TrieSnapshot:
    """Check the tree as a whole, then inflate the KV and build the snapshot."""
    nodes = parsed.nodes
    _check_tree(parsed)
    probs = parsed.log2_probs
    if probs.size and not (np.all(np.isfinite(probs)) and float(probs.max()) <= 0.0):
        raise _corrupt("holds a log2-probability that is NaN, infinite or above 0")
    depth = [0] * len(nodes)
    work = 0
    for index, node in enumerate(nodes):
        if node.parent >= 0:
            depth[index] = depth[node.parent] + node.tokens
            work += depth[index]
    if work > path_work_limit(file_bytes):
        raise TrieLimitError(
            f"the trie file's tree would cost {work:,} token positions of path hashing to "
            f"load, more than the {path_work_limit(file_bytes):,} a {file_bytes:,}-byte file "
            "may ask for")
    layout = parsed.layout
    extents = sorted(node.kv for node in nodes if node.kv is not None)
    position = 0
    for start, length in extents:
        if start != position:
            raise _corrupt("has KV extents that overlap or leave gaps")
        position = start + length
    if position != len(parsed.kv):
        raise _corrupt(f"has {len(parsed.kv) - position:,} KV bytes that no node claims")
    if layout is not None:
        itemsize = torch.empty((), dtype=layout.dtype).element_size()
        per_token = layout.layers * 2 * layout.kv_heads * layout.head_dim * itemsize
        inflated = per_token * sum(node.tokens for node in nodes if node.kv is not None)
        if inflated > kv_inflate_limit(len(parsed.kv)):
            raise TrieLimitError(
                f"the trie file's KV of {len(parsed.kv):,} compressed bytes declares "
                f"{inflated:,} bytes, more than the {kv_inflate_limit(len(parsed.kv)):,} real KV "
                f"compresses from (at most {TRIE_KV_MAX_RATIO}x): a decompression bomb")
    records = []
    offset = 0
    for node in nodes:
        kv = blob = None
        if node.kv is not None:
            start, length = node.kv
            if layout is None:
                raise _corrupt("has a node with KV but no KV layout")
            shape = (layout.layers, 2, layout.kv_heads, node.tokens, layout.head_dim)
            blob = parsed.kv[start : start + length]
            kv = decompress_kv(blob, shape, layout.dtype)
        tokens = parsed.tokens[offset : offset + node.tokens].copy()
        log2 = probs[offset : offset + node.tokens].copy()
        offset += node.tokens
        if node.parent == -1:
            records.append(NodeRecord(-1, Namespace(node.namespace), tokens, log2, None, 0, 0,
                                      parsed.clock))
        else:
            records.append(NodeRecord(node.parent, Namespace(node.namespace), tokens, log2, kv,
                                      node.hit_count, node.last_access, node.created, blob))
    return TrieSnapshot(records=tuple(records), clock=parsed.clock,
                        nominal_kv_bytes_per_token=parsed.nominal, kv_layout=layout)


def _check_tree(parsed: _Parsed) -> None:
    """Parents before children in pre-order, roots empty and one per namespace, children under
    a node with distinct first tokens (ascending in format 2), namespaces inherited, statistics
    not after the clock."""
    nodes = parsed.nodes
    first: list[int] = []
    offset = 0
    for node in nodes:
        first.append(int(parsed.tokens[offset]) if node.tokens else -1)
        offset += node.tokens
    roots: set[str] = set()
    path: list[int] = []
    last_child: dict[int, int] = {}
    for index, node in enumerate(nodes):
        if node.parent == -1:
            if node.tokens or node.kv is not None or node.namespace in roots:
                raise _corrupt(f"node {index} is a root that holds tokens or KV, or repeats a "
                               "namespace")
            roots.add(node.namespace)
            path = [index]
            continue
        if not 0 <= node.parent < index or node.tokens < 1:
            raise _corrupt(f"node {index} has parent {node.parent} or an empty edge")
        if nodes[node.parent].namespace != node.namespace:
            raise _corrupt(f"node {index} lies in another namespace than its parent")
        if max(node.hit_count, node.last_access, node.created) > parsed.clock:
            raise _corrupt(f"node {index} has statistics after the trie's clock {parsed.clock}")
        previous = last_child.get(node.parent)
        if previous is not None and (previous == first[index] or (
                parsed.canonical and previous > first[index])):
            raise _corrupt(f"node {index}: children of one node share or disorder first tokens")
        last_child[node.parent] = first[index]
        if parsed.canonical:
            while path and path[-1] != node.parent:
                path.pop()
            if not path:
                raise _corrupt(f"node {index} does not follow its parent in pre-order")
            path.append(index)

"""Fuzzing trie snapshots: format 2 (``seqkv.formats.framing``) and the JSON-headed format 1.

Each case loads a mutated snapshot (``trie_from_bytes``) and must end in a ``SeqKVError`` or in
a trie that passes ``audit`` and re-saves to exactly the loaded bytes (invariant 5 of
``seqkv.trie.persistence``). A snapshot holds no digest of its content, so a crafted file with a
valid checksum may be a valid snapshot of another trie: that outcome is counted apart
(``fuzz_oracle.OTHER_VALID``), and for the snapshot holding a ``.skv`` file's shared prefix the
file is then decoded with the loaded trie, which must give exactly the original tokens and KV or
a ``SeqKVError`` (the prefix's KV digest in the ``.skv`` header refuses another prefix). See
``tests/test_fuzz_harness.py`` for the mutations, the budget and ``SEQKV_FUZZ_CASES``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fuzz_oracle import OTHER_VALID, CountingTally, run_case
from seqkv import compress, decompress
from seqkv.formats.framing import unframe
from seqkv.models import CausalLM
from seqkv.trie import Namespace, PrefixTrie, prefix_hash, trie_from_bytes, trie_to_bytes
from seqkv.trie.persistence import _ERRORS, FORMAT_VERSION, LEGACY_MAGIC, MAGIC
from test_fuzz_harness import (
    Field,
    Walker,
    case_count,
    forge,
    mutate_bytes,
    mutate_framed,
    mutate_json,
    seed,
)

LEGACY = Path(__file__).parent / "data" / "legacy" / "trie-v1.trie"
PREFIXED = [5, 17, 17, 3, 99, 250, 60, 61, 62, 63]


@dataclass(frozen=True)
class Original:
    """A valid snapshot, and optionally a ``.skv`` file coded against one of its prefixes."""

    name: str
    data: bytes
    skv: bytes | None = None
    tokens: list[int] | None = None
    kv: torch.Tensor | None = None


def _random_kv(layers: int, heads: int, length: int, dim: int, dtype: torch.dtype,
               salt: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(salt)
    return torch.randn(layers, 2, heads, length, dim, generator=generator).to(dtype)  # [L,2,H,T,D]


@pytest.fixture(scope="module")
def originals(fuzz_model: CausalLM) -> list[Original]:
    made = []
    model_trie = PrefixTrie()
    prefix = PREFIXED[:6]
    model_trie.insert(prefix, [-1.0, -2.5, -0.5, -3.0, -1.25, -0.75],
                      fuzz_model.kv_tensor(fuzz_model.prefill(prefix)))
    model_trie.insert([5, 17, 40, 41], [-2.0, -1.0, -4.0, -0.5])  # splits the prefix; no KV
    model_trie.insert([1, 2, 3], [-1.0, -1.0, -1.0], namespace=Namespace("tenant"))
    model_trie.match([5, 17, 17, 3, 0])
    resolved = model_trie.resolve(prefix_hash(Namespace(""), prefix))
    skv = compress(fuzz_model, PREFIXED, kv=fuzz_model.prefill(PREFIXED), prefix=resolved).data
    decoded = decompress(fuzz_model, skv, prefixes=model_trie)
    made.append(Original("model-prefix", trie_to_bytes(model_trie), skv, decoded.tokens,
                         decoded.kv))
    tokens_only = PrefixTrie(nominal_kv_bytes_per_token=96)
    for index, sequence in enumerate(([1, 2, 3, 4], [1, 2, 9], [7], [1, 2, 3, 4, 5, 6])):
        tokens_only.insert(sequence, [-0.5 * (index + 1)] * len(sequence))
    tokens_only.insert([1, 2], [-1.0, -1.0], namespace=Namespace("other"))
    tokens_only.match([1, 2, 3, 8])
    made.append(Original("tokens-only", trie_to_bytes(tokens_only)))
    wide = PrefixTrie()
    big = [1 << 33, 3, (1 << 40) + 7]
    wide.insert(big, [-1.0, -2.0, -3.0], _random_kv(2, 1, 3, 4, torch.float16, 1))
    wide.insert([*big[:2], 11], [-1.0, -2.0, -0.5], _random_kv(2, 1, 3, 4, torch.float16, 2))
    made.append(Original("wide-fp16", trie_to_bytes(wide)))
    return made


def trie_fields(sections: list[bytes]) -> list[list[Field]]:
    """Where each field of a valid format-2 snapshot lies (see ``seqkv.trie.persistence``)."""
    header = Walker(sections[0])
    header.varint("clock")
    header.varint("nominal KV bytes per token")
    count = header.varint("node count")
    width = header.u8("token width")
    if header.u8("KV layout flag"):
        header.varint("layers")
        header.varint("KV heads")
        header.varint("head dimension")
        header.u8("dtype")
    header.u8("KV compression")
    names = Walker(sections[1])
    for index in range(names.varint("namespace count")):
        names.raw(names.varint(f"namespace {index} length"), f"namespace {index}")
    nodes = Walker(sections[2])
    blobs = Walker(sections[5])
    total = 0
    for index in range(count):
        if nodes.varint(f"node {index} parent") == 0:
            nodes.varint(f"node {index} namespace")
            continue
        total += nodes.varint(f"node {index} edge length")
        kv_length = nodes.varint(f"node {index} KV length")
        for name in ("hit count", "last access", "created"):
            nodes.varint(f"node {index} {name}")
        if kv_length:
            blobs.raw(kv_length, f"node {index} KV")
    tokens = Walker(sections[3])
    tokens.items(total, width, "u32" if width == 4 else "u64", "token")
    probs = Walker(sections[4])
    probs.items(total, 8, "f64", "log2 probability")
    return [header.fields, names.fields, nodes.fields, tokens.fields, probs.fields, blobs.fields]


def _check_prefix_use(model: CausalLM, original: Original, trie: PrefixTrie) -> bool:
    """Decoding the ``.skv`` file with ``trie`` gives the original output (or raises)."""
    if original.skv is None:
        return True
    result = decompress(model, original.skv, prefixes=trie)
    return (result.tokens == original.tokens and original.kv is not None
            and torch.equal(result.kv, original.kv))


def _attempt(model: CausalLM, original: Original, data: bytes) -> bool | str:
    trie = trie_from_bytes(data)
    trie.audit()
    again = trie_to_bytes(trie)
    assert again == data, "a snapshot loaded that does not re-save to its own bytes"
    if not _check_prefix_use(model, original, trie):
        return False
    return True if data == original.data else OTHER_VALID


def test_fuzz_format_2_structure(fuzz_model: CausalLM, originals: list[Original]) -> None:
    for number, original in enumerate(originals):
        tally = CountingTally(f"trie-format2-{original.name}")
        rng = np.random.default_rng(seed(400 + number))
        _, sections = unframe(original.data, MAGIC, (FORMAT_VERSION,), _ERRORS, "fixture")
        fields = trie_fields(sections)
        for _ in range(case_count(60)):
            what, data = mutate_framed(rng, sections, MAGIC, FORMAT_VERSION, fields)
            run_case(tally, what, partial(_attempt, fuzz_model, original, data))
        tally.check()


def test_fuzz_format_2_bytes(fuzz_model: CausalLM, originals: list[Original]) -> None:
    tally = CountingTally("trie-format2-bytes")
    rng = np.random.default_rng(seed(500))
    for _ in range(case_count(60)):
        original = originals[int(rng.integers(0, len(originals)))]
        what, data = mutate_bytes(rng, original.data)
        run_case(tally, f"{original.name}: {what}",
                 partial(_attempt, fuzz_model, original, data))
    tally.check()
    assert tally.outcomes[OTHER_VALID] == 0  # the CRC-32 refuses every byte-level change


_PREFIX = struct.Struct("<8sHHIQ")


def _legacy_parts(data: bytes) -> tuple[list[Any], Any, bytes]:
    fields = list(_PREFIX.unpack_from(data))
    header_len = fields[3]
    header = json.loads(data[_PREFIX.size : _PREFIX.size + header_len])
    return fields, header, data[_PREFIX.size + header_len : -32]


def _legacy_file(fields: list[Any], header: bytes, payload: bytes,
                 lengths: tuple[int, int] | None = None) -> bytes:
    values = list(fields)
    values[3:5] = lengths if lengths is not None else (len(header), len(payload))
    body = _PREFIX.pack(*values) + header + payload
    return body + hashlib.sha256(body).digest()


def mutate_legacy(rng: np.random.Generator, data: bytes) -> tuple[str, bytes]:
    """A structural mutation of a format-1 snapshot, its SHA-256 recomputed."""
    fields, header, payload = _legacy_parts(data)
    roll = rng.random()
    if roll < 0.6:
        what, text = mutate_json(rng, header)
        return f"header {what}", _legacy_file(fields, text, payload)
    text = json.dumps(header).encode()
    if roll < 0.75:
        what, changed = mutate_bytes(rng, payload)
        return f"payload: {what}", _legacy_file(fields, text, changed)
    if roll < 0.9:
        total = sum(node["tokens"] for node in header["nodes"])
        walker = Walker(payload)
        walker.items(total, 8, "u64", "token")
        walker.items(total, 8, "f64", "log2 probability")
        walker.rest("KV")
        chosen = walker.fields[int(rng.integers(0, len(walker.fields)))]
        what, forged = forge(rng, payload[chosen.offset : chosen.offset + chosen.length],
                             chosen.kind)
        changed = payload[: chosen.offset] + forged + payload[chosen.offset + chosen.length :]
        return f"payload {chosen.name} {what}", _legacy_file(fields, text, changed)
    values = list(fields)
    slot = int(rng.integers(1, 5))
    width = (0, 16, 16, 32, 64)[slot]
    values[slot] = int(rng.choice([0, 1, 2, 3, 7, 2**16 - 1, 2**31, 2**32 - 1, 2**63])) % (
        1 << width)
    body = _PREFIX.pack(*values) + text + payload
    return f"prefix field {slot} = {values[slot]}", body + hashlib.sha256(body).digest()


def test_fuzz_format_1(fuzz_model: CausalLM) -> None:
    data = LEGACY.read_bytes()
    assert data[: len(LEGACY_MAGIC)] == LEGACY_MAGIC
    canonical = trie_to_bytes(trie_from_bytes(data))
    tally = CountingTally("trie-format1")
    rng = np.random.default_rng(seed(600))

    def attempt(mutated: bytes) -> bool | str:
        trie = trie_from_bytes(mutated)
        trie.audit()
        again = trie_to_bytes(trie)
        assert trie_to_bytes(trie_from_bytes(again)) == again, "a re-saved snapshot changed"
        return True if again == canonical else OTHER_VALID

    for _ in range(case_count(60)):
        what, mutated = mutate_legacy(rng, data)
        run_case(tally, what, partial(attempt, mutated))
    for _ in range(case_count(60) // 3):
        what, mutated = mutate_bytes(rng, data)
        run_case(tally, what, partial(attempt, mutated))
    tally.check()


def test_the_trie_fields_cover_every_byte(originals: list[Original]) -> None:
    """The walker's layout is the writer's: its fields tile each section (the token and
    probability items are sampled, so those two are checked by size)."""
    for original in originals:
        _, sections = unframe(original.data, MAGIC, (FORMAT_VERSION,), _ERRORS, "fixture")
        fields = trie_fields(sections)
        for index in (0, 1, 2, 5):
            assert sum(f.length for f in fields[index]) == len(sections[index]), index
        assert {f.kind for f in fields[3]} <= {"u32", "u64"}

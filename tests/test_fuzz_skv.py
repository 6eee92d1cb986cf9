"""Fuzzing .skv files: format 3 at every level, and the JSON-headed formats 1 and 2.

Each case decodes a mutated file as a user would (``read_skv``, what ``seqkv inspect``
prints, ``decompress`` with the model, and ``decompress_tokens`` without it where the level
allows) and must end in a ``SeqKVError`` or give exactly the original tokens and KV (see
``tests/test_fuzz_harness.py`` for the mutations, the budget and ``SEQKV_FUZZ_CASES``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from legacy_files import LEGACY, LEGACY_TOKENS, assert_refused, must_decode_here
from seqkv import compress, decompress, decompress_tokens
from seqkv.cli.sessions import inspect_figures
from seqkv.descriptions import Descriptions
from seqkv.errors import EnvironmentMismatchError, ModelMismatchError
from seqkv.formats.framing import unframe
from seqkv.formats.skv import _ERRORS, FORMAT_VERSION, MAGIC, read_skv
from seqkv.models import CausalLM
from seqkv.trie import PrefixTrie
from test_fuzz_harness import (
    Field,
    Tally,
    Walker,
    case_count,
    mutate_bytes,
    mutate_framed,
    mutate_json,
    seed,
)

TOKENS = [5, 17, 17, 3, 99, 250, 7, 7, 7, 31, 400, 12, 8, 8, 301, 77]
PREFIXED = [5, 17, 17, 3, 99, 250, 60, 61, 62, 63]


@dataclass(frozen=True)
class Original:
    """A valid file and what it decodes to."""

    name: str
    data: bytes
    tokens: list[int]
    kv: torch.Tensor | None  # None: this machine does not reproduce the file's float coding
    prefixes: PrefixTrie | None = None


def _noisy(model: CausalLM, tokens: list[int]) -> torch.Tensor:
    kv = model.kv_tensor(model.prefill(tokens))  # [L, 2, H, T, D]
    return kv + 3e-5 * torch.randn(kv.shape, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def originals(fuzz_model: CausalLM) -> list[Original]:
    cases: dict[str, dict[str, Any]] = {
        "tokens": {"kv": fuzz_model.prefill(TOKENS)},
        "tokens-1e-5": {"kv": _noisy(fuzz_model, TOKENS), "tolerance": 1e-5},
        "tokens-bitexact": {"kv": _noisy(fuzz_model, TOKENS), "tolerance": 0.0},
        "rows": {"kv": fuzz_model.prefill(TOKENS), "level": "rows"},
        "segments-3": {"kv": fuzz_model.prefill(TOKENS), "level": "segments:3"},
        "ngram": {"kv": fuzz_model.prefill(TOKENS), "level": "ngram"},
        "plain": {"level": "plain"},
        "portable": {"kv": fuzz_model.prefill(TOKENS), "level": "portable"},
    }
    made = []
    for name, options in cases.items():
        data = compress(fuzz_model, TOKENS, **options).data
        decoded = decompress(fuzz_model, data)
        made.append(Original(name, data, decoded.tokens, decoded.kv))
    trie = PrefixTrie()
    prefix = PREFIXED[:6]
    trie.insert(prefix, [-1.0] * 6, fuzz_model.kv_tensor(fuzz_model.prefill(prefix)))
    resolved = trie.match(prefix)
    assert resolved.length == 6
    data = compress(fuzz_model, PREFIXED, kv=fuzz_model.prefill(PREFIXED),
                    prefix=trie.resolve(resolved.prefix_hash)).data
    decoded = decompress(fuzz_model, data, prefixes=trie)
    made.append(Original("prefix", data, decoded.tokens, decoded.kv, trie))
    return made


def skv_fields(sections: list[bytes]) -> list[list[Field]]:
    """Where each field of a valid format-3 file lies (see ``seqkv.formats.skv``)."""
    header = Walker(sections[0])
    flags = header.u8("flags")
    header.u8("level id")
    header.varint("level parameter")
    header.varint("token count")
    if flags & 4:
        header.varint("vocabulary size")
    for name in ("model digest", "profile digest", "tokens digest", "KV digest"):
        header.raw(8, name)
    if flags & 1:
        header.raw(32, "prefix hash")
        header.varint("prefix tokens")
        header.raw(8, "prefix KV digest")
    if flags & 8:
        header.raw(32, "dictionary digest")
    code = Walker(sections[1])
    code.items(len(sections[1]), 1, "u8", "token code")
    fields = [header.fields, code.fields]
    if len(sections) > 2:
        fields.append(residual_fields(sections[2]))
    return fields


def residual_fields(section: bytes, base: int = 0) -> list[Field]:
    residual = Walker(section, base)
    mode = residual.u8("mode")
    if mode == 0:
        residual.raw(8, "tolerance", "f64")
    groups = residual.varint("groups")
    bitmap = residual.raw((groups + 7) // 8, "bitmap")
    used = sum(bin(b).count("1") for b in bitmap)
    for index in range(used):
        residual.raw(4, f"scale {index}", "f32")
    residual.varint("escapes")
    residual.rest("words and escapes")
    return residual.fields


def _attempt(model: CausalLM, original: Original, data: bytes,
             descriptions: Descriptions) -> bool:
    read = read_skv(data)
    inspect_figures(read, len(data), descriptions)
    result = decompress(model, data, prefixes=original.prefixes)
    same = result.tokens == original.tokens and (original.kv is None
                                                  or torch.equal(result.kv, original.kv))
    try:
        tokens = decompress_tokens(data, prefixes=original.prefixes)
    except EnvironmentMismatchError:  # a model-coded level: it needs the model
        return same
    return same and tokens == original.tokens


def test_fuzz_format_3_structure(fuzz_model: CausalLM, originals: list[Original],
                                 tmp_path: Path) -> None:
    descriptions = Descriptions(tmp_path)
    for number, original in enumerate(originals):
        tally = Tally(f"skv-format3-{original.name}")
        rng = np.random.default_rng(seed(100 + number))
        _, sections = unframe(original.data, MAGIC, (FORMAT_VERSION,), _ERRORS, "fixture")
        fields = skv_fields(sections)
        for _ in range(case_count(40)):
            what, data = mutate_framed(rng, sections, MAGIC, FORMAT_VERSION, fields)
            tally.run(what, lambda d=data, o=original: _attempt(fuzz_model, o, d, descriptions))
        tally.check()


def test_fuzz_format_3_bytes(fuzz_model: CausalLM, originals: list[Original],
                             tmp_path: Path) -> None:
    descriptions = Descriptions(tmp_path)
    tally = Tally("skv-format3-bytes")
    rng = np.random.default_rng(seed(200))
    for _ in range(case_count(40)):
        original = originals[int(rng.integers(0, len(originals)))]
        what, data = mutate_bytes(rng, original.data)
        tally.run(f"{original.name}: {what}",
                  lambda d=data, o=original: _attempt(fuzz_model, o, d, descriptions))
    tally.check()


_PREFIX = struct.Struct("<8sHHIQQQ")


def _legacy_parts(data: bytes) -> tuple[list[int], Any, list[bytes]]:
    """A format-1 or 2 file's prefix fields, JSON header and sections."""
    fields = list(_PREFIX.unpack_from(data))
    header_len, lengths = fields[3], fields[4:7]
    offset = _PREFIX.size
    header = json.loads(data[offset : offset + header_len])
    offset += header_len
    sections = []
    for length in lengths:
        sections.append(data[offset : offset + length])
        offset += length
    return fields, header, sections


def _legacy_file(fields: list[int], header: bytes, sections: list[bytes],
                 lengths: list[int] | None = None) -> bytes:
    values = list(fields)
    values[3] = len(header)
    values[4:7] = lengths if lengths is not None else [len(s) for s in sections]
    body = _PREFIX.pack(*values) + header + b"".join(sections)
    return body + hashlib.sha256(body).digest()


def mutate_legacy(rng: np.random.Generator, data: bytes) -> tuple[str, bytes]:
    """A structural mutation of a format-1 or 2 file, its SHA-256 recomputed."""
    fields, header, sections = _legacy_parts(data)
    roll = rng.random()
    if roll < 0.65:
        what, text = mutate_json(rng, header)
        return f"header {what}", _legacy_file(fields, text, sections)
    text = json.dumps(header).encode()
    if roll < 0.85:
        index = int(rng.integers(0, 3))
        what, changed = mutate_bytes(rng, sections[index])
        sections[index] = changed
        return f"section {index}: {what}", _legacy_file(fields, text, sections)
    values = list(fields)
    slot = int(rng.integers(1, 7))
    width = (0, 16, 16, 32, 64, 64, 64)[slot]
    value = int(rng.choice([0, 1, 2, 3, 7, 2**16 - 1, 2**31, 2**32 - 1, 2**63]))
    values[slot] = value % (1 << width)
    body = _PREFIX.pack(*values) + text + b"".join(sections)
    return f"prefix field {slot} = {values[slot]}", body + hashlib.sha256(body).digest()


@pytest.mark.parametrize("name", sorted(p.name for p in LEGACY.glob("*.skv")))
def test_fuzz_formats_1_and_2(tiny_model: CausalLM, tmp_path: Path, name: str) -> None:
    """The files were coded under one machine's float profile with the tiny model; where this
    machine's profile differs, a float-level file is refused by name (EnvironmentMismatchError,
    ``legacy_files``), and every mutant must still be refused or decode to the recorded
    tokens."""
    data = (LEGACY / name).read_bytes()
    if must_decode_here(tiny_model, data):
        decoded = decompress(tiny_model, data)
        assert decoded.tokens == LEGACY_TOKENS
        original = Original(name, data, decoded.tokens, decoded.kv)
    else:
        assert_refused(tiny_model, data)
        original = Original(name, data, LEGACY_TOKENS, None)
    descriptions = Descriptions(tmp_path)
    tally = Tally(f"skv-legacy-{name.removesuffix('.skv')}")
    rng = np.random.default_rng(seed(300 + sorted(p.name for p in LEGACY.glob("*.skv")).index(
        name)))
    for _ in range(case_count(30)):
        what, mutated = mutate_legacy(rng, data)
        tally.run(what, lambda d=mutated: _attempt(tiny_model, original, d, descriptions))
    for _ in range(case_count(30) // 3):
        what, mutated = mutate_bytes(rng, data)
        tally.run(what, lambda d=mutated: _attempt(tiny_model, original, d, descriptions))
    tally.check()


def test_the_model_digest_covers_the_tokenizer(fuzz_model: CausalLM,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17: a file coded with another tokenizer (same config and weights) is refused."""
    data = compress(fuzz_model, TOKENS).data
    identity = fuzz_model.identity
    other = dataclasses.replace(identity, tokenizer_sha256="0" * 64)
    assert other.same_model(identity)  # what formats 1 and 2 compared: config and weights
    monkeypatch.setitem(fuzz_model.__dict__, "identity", other)
    with pytest.raises(ModelMismatchError, match="another model"):
        decompress(fuzz_model, data)


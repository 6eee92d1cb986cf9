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
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from legacy_files import LEGACY, LEGACY_TOKENS, assert_refused, must_decode_here
from seqkv import compress, decompress, decompress_tokens
from seqkv.cli.sessions import inspect_figures
from seqkv.coding.arithmetic import ArithmeticEncoder, BitStream
from seqkv.descriptions import Descriptions
from seqkv.digests import NO_PROFILE, tokens_digest
from seqkv.errors import EnvironmentMismatchError, ModelMismatchError
from seqkv.formats.framing import unframe
from seqkv.formats.skv import _ERRORS, FORMAT_VERSION, MAGIC, read_skv, write_skv
from seqkv.levels import parse_level
from seqkv.levels.base import TraceColumns
from seqkv.levels.model_free import ModelFreeLevel, code_tokens
from seqkv.limits import MAX_POSITIONS, MODEL_FREE_MAX_TOKENS
from seqkv.models import CausalLM
from seqkv.session import CodedSession
from seqkv.trie import PrefixTrie
from test_fuzz_harness import (
    Field,
    Tally,
    Walker,
    case_count,
    forged_code,
    forged_count,
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


def model_free_file(level: str, vocab: int, tokens: list[int]) -> bytes:
    """A format-5 file of ``tokens`` at a model-free level and any vocabulary, coded without a
    model (the digests of a model and profile are placeholders: a tokens-only decode reads
    neither)."""
    source = parse_level(level)
    assert isinstance(source, ModelFreeLevel)
    encoder = ArithmeticEncoder()
    code_tokens(source, vocab, [], tokens, encoder, TraceColumns(with_entropy=False))
    return write_skv(CodedSession(
        level=level, count=len(tokens), segments=(len(tokens),), vocab_size=vocab,
        model_digest=NO_PROFILE, profile_digest=NO_PROFILE, tokens_digest=tokens_digest(tokens),
        kv_digest=NO_PROFILE, prefix=None, dictionary=None, token_code=encoder.finish(),
        residual=None, code_form="floored"), 5).data


def _forged_file(rng: np.random.Generator, data: bytes, caps: list[int]) -> tuple[str, bytes]:
    """``data`` with its count forged, its code kept or replaced, in format 5 or 4 (checksum
    recomputed by the writer)."""
    session = read_skv(data).session
    count = forged_count(rng, session.count, caps)
    what, code = forged_code(rng, session.token_code.data)
    version = int(rng.choice([4, 5]))
    forged = dataclasses.replace(session, count=count, segments=(count,),
                                 token_code=BitStream(code, 8 * len(code)))
    return f"format {version}, count {count:,}, {what}", write_skv(forged, version).data


def test_fuzz_forged_counts(fuzz_model: CausalLM, originals: list[Original],
                            tmp_path: Path) -> None:
    """Issue 44: each original's token count forged (the checksum recomputed) past itself, to
    the model's context and to the model-free caps, its code kept, emptied or replaced, in
    format 5 (whose decoder guards the code's information) and 4 (whose does not), decoded with
    the model and without: every case ends in a ``SeqKVError`` or the original within the
    budget."""
    descriptions = Descriptions(tmp_path)
    tally = Tally("skv-forged-counts")
    rng = np.random.default_rng(seed(500))
    caps = [fuzz_model.config.max_position_embeddings, 4096, MODEL_FREE_MAX_TOKENS,
            MAX_POSITIONS]
    for original in originals:
        for _ in range(case_count(6)):
            what, data = _forged_file(rng, original.data, caps)
            tally.run(f"{original.name}: {what}",
                      partial(_attempt, fuzz_model, original, data, descriptions))
    tally.check()


@pytest.mark.parametrize("level", ["ngram", "plain"])
def test_fuzz_forged_counts_at_the_model_free_cap(level: str) -> None:
    """Issue 44: a model-free file at a vocabulary of 2 whose count says up to
    ``MODEL_FREE_MAX_TOKENS`` (the attack's file: ngram, 2**17 tokens, no code),
    decoded without the model: refused or the original, each within the budget (at ngram
    the whole count decodes: a token may take next to no bits)."""
    tokens = [int(t) for t in np.random.default_rng(seed(600)).integers(0, 2, 64)]
    data = model_free_file(level, 2, tokens)
    session = read_skv(data).session
    tally = Tally(f"skv-forged-counts-model-free-{level}")
    cases = [("the attack's file", 5, MODEL_FREE_MAX_TOKENS, b"")]
    rng = np.random.default_rng(seed(601 + (level == "plain")))
    for _ in range(case_count(3)):
        cases.append(("random code", int(rng.choice([4, 5])), MODEL_FREE_MAX_TOKENS,
                      rng.bytes(int(rng.integers(1, 4096)))))
    cases.append(("past the cap", 5, MODEL_FREE_MAX_TOKENS + 1, b""))
    for what, version, count, code in cases:
        forged = write_skv(dataclasses.replace(session, count=count, segments=(count,),
                                               token_code=BitStream(code, 8 * len(code))),
                           version).data
        tally.run(f"{what}: format {version}, count {count:,}, {len(forged)} bytes",
                  partial(lambda d: decompress_tokens(d) == tokens, forged))
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


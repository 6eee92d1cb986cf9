"""Fuzz classes for bounded work: forged token counts, inputs quadratic for a naive pre-parse
guard, vocabularies below 2, and non-canonical token codes.

Each case runs under the harness's budget (``tests/test_fuzz_harness.py``: 2 s and 256 MiB of
peak resident memory beyond what the loaded model and the fixtures hold) and must end in a
``SeqKVError`` or in exactly the original output; for the canonical class, a file that differs
from the original in its bytes must be refused (two files never decode alike). The model is the
tiny Llama with its full context of 4,096 positions (``tiny_model``): a forged count within the
context is what the information guard of ``.skv`` format 5 has to stop. Tallies are named
``skv-bounds-*`` so that ``scripts/fuzz_summary.py`` reports them with
their formats.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from seqkv import compress, decompress, decompress_tokens
from seqkv.codec import DecodeItem, decode_many
from seqkv.errors import DecodeLimitError, EnvironmentMismatchError
from seqkv.formats.framing import frame, unframe
from seqkv.formats.skv import _ERRORS, MAGIC, read_skv, write_skv
from seqkv.limits import MAX_MODEL_FREE_WORK, MAX_VOCAB, MODEL_FREE_MAX_VOCAB
from seqkv.models import CausalLM
from test_fuzz_harness import HOSTILE_INTEGERS, Tally, case_count

TOKENS = [5, 17, 17, 3, 99, 250, 7, 7, 7, 31, 400, 12, 8, 8, 301, 77]
LEVELS = ("tokens", "rows", "segments:3", "portable", "ngram", "plain")
LEGACY = Path(__file__).parent / "data" / "legacy"
_LEGACY_SKV = struct.Struct("<8sHHIQQQ")


@pytest.fixture(scope="module")
def files(tiny_model: CausalLM) -> dict[str, bytes]:
    """Format-5 files of every level, with a residual (a noisy KV) where the level codes one."""
    kv = tiny_model.kv_tensor(tiny_model.prefill(TOKENS))  # [L, 2, H, T, D]
    noisy = kv + 3e-5 * torch.randn(kv.shape, generator=torch.Generator().manual_seed(0))
    return {level: compress(tiny_model, TOKENS, noisy, level=level).data for level in LEVELS}


@pytest.fixture(scope="module")
def exact_files(tiny_model: CausalLM) -> dict[str, bytes]:
    """Format-5 files whose residual is all zeros (the caller's KV is the recomputed one)."""
    kv = tiny_model.kv_tensor(tiny_model.prefill(TOKENS))  # [L, 2, H, T, D]
    return {level: compress(tiny_model, TOKENS, kv, level=level).data for level in LEVELS}


def _decoded(model: CausalLM, data: bytes) -> bool:
    """Decode as a user would (with the model, then without where the level allows); whether
    the output is the original tokens."""
    same = decompress(model, data).tokens == TOKENS
    try:
        return same and decompress_tokens(data) == TOKENS
    except EnvironmentMismatchError:  # a model-coded level
        return same


def _with_count(data: bytes, count: int, consistent: bool) -> bytes:
    session = read_skv(data).session
    parts = len(session.segments)
    segments = (tuple(count // parts + (1 if j < count % parts else 0) for j in range(parts))
                if consistent else session.segments)
    return write_skv(dataclasses.replace(session, count=count, segments=segments)).data


def test_fuzz_forged_counts(tiny_model: CausalLM, files: dict[str, bytes]) -> None:
    """Every level's file with its token count forged to hostile values, segments adjusted or
    not: refused by the limits, the information guard or the checksums, within the budget."""
    tally = Tally("skv-bounds-forged-counts")
    counts = [c for c in HOSTILE_INTEGERS if 1 <= c < 1 << 31][: case_count(40)]
    for level, data in files.items():
        for count in counts:
            for consistent in (True, False):
                forged = _with_count(data, count, consistent)
                tally.run(f"{level}: count {count}{'' if consistent else ', segments kept'}",
                          lambda d=forged: _decoded(tiny_model, d))
    tally.check()


def test_fuzz_vocabularies_below_2(tiny_model: CausalLM, files: dict[str, bytes]) -> None:
    """A model-free file stating a vocabulary of 0 or 1 (format 5, and format 2's JSON), and a
    session stating one handed to the API: refused before any table is built."""
    tally = Tally("skv-bounds-vocabularies")
    for level in ("ngram", "plain"):
        session = read_skv(files[level]).session
        for vocab in (0, 1):
            small = dataclasses.replace(session, vocab_size=vocab)
            tally.run(f"{level} format 5: vocabulary {vocab}",
                      lambda s=small: _decoded(tiny_model, write_skv(s).data))
            tally.run(f"{level} decode_many: vocabulary {vocab}",
                      lambda s=small: decode_many(tiny_model, [DecodeItem(s)])[0].tokens
                      == TOKENS)
        legacy = (LEGACY / f"v2-{level}.skv").read_bytes()
        for vocab in (0, 1, -1):
            forged = _legacy_with(legacy, ("tokens", "vocab_size"), vocab)
            tally.run(f"{level} format 2: vocabulary {vocab}",
                      lambda d=forged: _decoded(tiny_model, d))
    tally.check()


def test_fuzz_vocabularies_above_the_model_free_cap(tiny_model: CausalLM,
                                                     files: dict[str, bytes]) -> None:
    """A model-free file of format 4 or 5 stating a vocabulary above ``MODEL_FREE_MAX_VOCAB``
    (up to the format's 2**22) with a count within the work cap, decoded without the model:
    refused before any table is built (a decode of 1,024 tokens at 2**22 took over 60 s), and
    with the model, refused by its vocabulary."""
    tally = Tally("skv-bounds-vocabularies-above-cap")
    for level in ("ngram", "plain"):
        session = read_skv(files[level]).session
        for vocab in (MODEL_FREE_MAX_VOCAB + 1, MAX_VOCAB):
            count = min(1024, MAX_MODEL_FREE_WORK // vocab)
            large = dataclasses.replace(session, vocab_size=vocab, count=count,
                                        segments=(count,))
            for version in (4, 5):
                data = write_skv(large, version).data
                case = f"{level} format {version}: vocabulary {vocab}, count {count}"
                tally.run(f"{case}, without the model",
                          lambda d=data: decompress_tokens(d) == TOKENS)
                tally.run(f"{case}, with the model", lambda d=data: _decoded(tiny_model, d))
                with pytest.raises(DecodeLimitError, match="vocabulary"):
                    decompress_tokens(data)
    tally.check()


def _legacy_with(data: bytes, key: tuple[str, str], value: object) -> bytes:
    """A format-1/2 file with one header value replaced, its SHA-256 recomputed."""
    fields = list(_LEGACY_SKV.unpack_from(data))
    start = _LEGACY_SKV.size
    header = json.loads(data[start : start + fields[3]])
    header[key[0]][key[1]] = value
    return _legacy_raw(data, json.dumps(header).encode())


def _legacy_raw(data: bytes, header: bytes) -> bytes:
    fields = list(_LEGACY_SKV.unpack_from(data))
    rest = data[_LEGACY_SKV.size + fields[3] : -32]
    fields[3] = len(header)
    body = _LEGACY_SKV.pack(*fields) + header + rest
    return body + hashlib.sha256(body).digest()


def test_fuzz_quadratic_inputs() -> None:
    """Headers that cost a regular-expression guard quadratic time: a string of escaped quotes
    that never ends, long runs of backslashes, brackets nested to the cap, at the size caps of
    the JSON-headed formats (format-1/2 .skv: 64 KiB)."""
    tally = Tally("skv-bounds-quadratic")
    skv = (LEGACY / "v2-tokens.skv").read_bytes()
    bodies = {
        "escaped quotes, unterminated": b'{"writer":"' + b'\\"' * 32_700,
        "escaped quotes, terminated": b'{"writer":"' + b'\\"' * 32_700 + b'"}',
        "backslashes": b'{"writer":"' + b"\\" * 65_000,
        "quotes and brackets": b'["' + b'\\"[{' * 16_000,
        "nested to depth 4": b"[[[[" * 16_000,
        "one byte over the cap": b" " * (64 * 1024 + 1),
    }
    for what, header in bodies.items():
        tally.run(f".skv format 2: {what}", lambda h=header: _decoded_header(skv, h))
    tally.check()


def _decoded_header(data: bytes, header: bytes) -> bool:
    read_skv(_legacy_raw(data, header))
    return False  # a header of no known file: accepting it would be wrong


def _token_code_variants(data: bytes) -> list[tuple[str, bytes]]:
    """Files that differ from ``data`` only in bits of the token code that an arithmetic
    decoder reads alike: padding bits claimed as code, zero bytes appended, the last one bit
    moved further out."""
    version, sections = unframe(data, MAGIC, (4, 5), _ERRORS, "fixture")
    header, code = bytearray(sections[0]), sections[1]
    padding = header[0] >> 5
    variants = []
    for extra in range(1, 4):
        bits = padding - extra
        body = code if bits >= 0 else code + b"\x00" * ((-bits + 7) // 8)
        new = bytearray(header)
        new[0] = (new[0] & 0x1F) | (bits % 8) << 5
        variants.append((f"{extra} zero bits appended", [bytes(new), body, *sections[2:]]))
    variants.append(("a zero byte appended, padding kept", [bytes(header), code + b"\x00",
                                                            *sections[2:]]))
    if code:
        last = bytearray(code)
        last[-1] &= ~(1 << padding) & 0xFF
        moved = bytes(last) + b"\x80"
        new = bytearray(header)
        new[0] &= 0x1F
        variants.append(("the last one bit moved a byte out",
                         [bytes(new), moved, *sections[2:]]))
    return [(what, frame(MAGIC, version, parts)) for what, parts in variants]


def _residual_variants(data: bytes) -> list[tuple[str, bytes]]:
    """Format-5 files whose residual differs from ``data``'s in what its decoder reads alike
    or nearly: a coder word appended (zero or not), the first used scale one float32 step off,
    a coder word where no group is used."""
    session = read_skv(data).session
    residual = session.residual
    assert residual is not None
    changed = [("a zero coder word appended", dataclasses.replace(
                   residual, words=residual.words + b"\0\0\0\0")),
               ("a coder word appended", dataclasses.replace(
                   residual, words=residual.words + b"\1\2\3\4"))]
    used = [i for i, scale in enumerate(residual.scales) if scale]
    if used:
        scales = list(residual.scales)
        scales[used[0]] = float(np.nextafter(np.float32(scales[used[0]]), np.float32(9)))
        changed.append(("a scale one step off", dataclasses.replace(residual,
                                                                    scales=tuple(scales))))
    return [(what, write_skv(dataclasses.replace(session, residual=r)).data)
            for what, r in changed]


def test_fuzz_non_canonical_codes(tiny_model: CausalLM, files: dict[str, bytes],
                                  exact_files: dict[str, bytes]) -> None:
    """Token codes changed in bits the decoder reads alike (formats 5 and 4) and format-5
    residuals changed alike: each such file must be refused (no two files decode alike)."""
    tally = Tally("skv-bounds-non-canonical")
    for level, data in files.items():
        old = write_skv(read_skv(data).session, 4).data
        variants = [(5, *v) for v in _token_code_variants(data)]
        variants += [(4, *v) for v in _token_code_variants(old)]
        variants += [(5, *v) for v in _residual_variants(data)]
        variants += [(5, f"{what}, a residual of zeros", d)
                     for what, d in _residual_variants(exact_files[level])]
        for version, what, variant in variants:
            tally.run(f"{level} format {version}: {what}",
                      lambda d=variant: not _decoded(tiny_model, d))
    tally.check()

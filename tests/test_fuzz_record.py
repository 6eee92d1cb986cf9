"""Fuzzing the store's span records in a local directory store.

A directory store (``seqkv.store.backends.directory``) keeps one record file per span: a
session's own span, and the prefix spans that other sessions extend (``seqkv.formats.span``).
Each case mutates one record file in place (a structural
mutation with its CRC-32 recomputed, or a random byte mutation without), then reads with a store
that keeps nothing hot: one session whose chain holds the span must come back with exactly its
original tokens and KV or end in a ``SeqKVError``, and one session whose chain does not hold it
must come back exactly as stored. The file is then restored. See ``tests/test_fuzz_harness.py``
for the mutations, the budget and ``SEQKV_FUZZ_CASES``.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from fuzz_oracle import CountingTally
from seqkv.coding.arithmetic import BitStream
from seqkv.errors import SeqKVError
from seqkv.formats.framing import encode_varint, read_varint
from seqkv.formats.span import read_span, write_span
from seqkv.models import CausalLM
from seqkv.store import SessionStore, model_codecs
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.errors import CorruptRecordError
from seqkv.store.ids import SessionName, SpanId, check_namespace, namespace_key
from test_fuzz_harness import (
    BUDGET,
    Field,
    Walker,
    case_count,
    forged_code,
    forged_count,
    mutate_bytes,
    mutate_sections,
    seed,
)
from test_fuzz_skv import residual_fields

NAMESPACE = "fuzz"
# NOTE: a record whose token count is forged up to the model's context costs that many decode
# steps before the chain's digest refuses it: measured 18.6-21 s for a count of 4,096 at the rows
# level on the tiny model's full context (shared 2-core machine). That work is bounded by the
# context, not by the record's size, so this suite runs on ``fuzz_model`` (128 positions, see
# conftest.py) and keeps the harness's budget.
RECORD_BUDGET = BUDGET
BASE = [(11 * i + 5) % 500 for i in range(40)]


@dataclass(frozen=True)
class Stored:
    """A session as put, and the spans of its chain (root first)."""

    name: str
    tokens: list[int]
    kv: torch.Tensor
    spans: tuple[SpanId, ...]


@dataclass(frozen=True)
class Fixture:
    root: Path
    backend: DirectoryBackend
    sessions: list[Stored]

    def path(self, span: SpanId) -> Path:
        return self.backend._path(span)


def _noisy(model: CausalLM, tokens: list[int], salt: int) -> torch.Tensor:
    kv = model.kv_tensor(model.prefill(tokens))  # [L, 2, H, T, D]
    generator = torch.Generator().manual_seed(salt)
    return kv + 3e-4 * torch.randn(kv.shape, generator=generator)



def _read_back(backend: DirectoryBackend, model: CausalLM, names: Sequence[str]) -> list[Stored]:
    """Each named session as the store returns it, with its chain's span ids."""
    ids = [SessionName(name) for name in names]
    chains = backend.fetch_sessions(namespace_key(check_namespace(NAMESPACE)), ids)
    reader = SessionStore(backend, model_codecs(model), hot_bytes=0)
    sessions = []
    for name, chain in zip(ids, chains, strict=True):
        assert chain is not None
        got = reader.get(name, namespace=NAMESPACE)
        assert got.kv is not None
        sessions.append(Stored(name, got.tokens, got.kv, tuple(s.span for s in chain.chain)))
    return sessions

@pytest.fixture(scope="module")
def stored(fuzz_model: CausalLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    root = tmp_path_factory.mktemp("store")
    store = SessionStore.directory(root, fuzz_model)
    child = [*BASE[:32], 7, 8, 9, 10, 300, 301]
    appended = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
    other = [(7 * i + 2) % 500 for i in range(24)]
    store.put("base", BASE, fuzz_model.prefill(BASE), level="rows", namespace=NAMESPACE)
    store.put("child", child, fuzz_model.prefill(child), level="rows", namespace=NAMESPACE)
    store.put("appended", appended[:8], fuzz_model.prefill(appended[:8]), level="tokens",
              namespace=NAMESPACE)
    store.append("appended", appended[8:], namespace=NAMESPACE)
    store.put("noisy", other, _noisy(fuzz_model, other, 1), level="segments:2",
              namespace=NAMESPACE)
    store.put("short", BASE[:20], fuzz_model.prefill(BASE[:20]), level="rows",
              namespace=NAMESPACE)
    store.close()
    backend = DirectoryBackend(root)
    yield Fixture(root, backend, _read_back(backend, fuzz_model, (
        "base", "child", "appended", "noisy", "short")))
    backend.close()


def record_fields(record: bytes) -> list[Field]:
    """Where each field of a valid span record (version 3) lies."""
    walker = Walker(record[:-4])
    flags = record[0] & 0x0F
    walker.u8("head")
    walker.varint("codec")
    walker.varint("parent")
    walker.varint("start")
    walker.varint("count")
    walker.u8("code padding")
    walker.raw(8, "tokens digest")
    if flags & 8:
        walker.raw(8, "KV digest")
    if flags & 4:
        walker.raw(32, "dictionary digest")
    if flags & 2:
        length, _ = read_varint(record, walker.offset)
        walker.varint("residual length")
        walker.fields += residual_fields(record[walker.offset : walker.offset + length],
                                         walker.offset)
        walker.offset += length
    walker.items(len(record) - 4 - walker.offset, 1, "u8", "token code")
    return walker.fields


def mutate_record(rng: np.random.Generator, record: bytes) -> tuple[bool, str, bytes]:
    """A mutation of a span record: whether it is structural (80%: a field forged or a span
    changed, the CRC-32 recomputed) or a random byte mutation, what it did, the bytes."""
    if rng.random() < 0.2:
        return (False, *mutate_bytes(rng, record))
    what, sections = mutate_sections(rng, [record[:-4]], [record_fields(record)])
    changed = b"".join(sections)
    return True, what, changed + struct.pack("<I", zlib.crc32(changed))


def _same(got_tokens: list[int], got_kv: torch.Tensor | None, want: Stored) -> bool:
    return got_tokens == want.tokens and got_kv is not None and torch.equal(got_kv, want.kv)


def _attempt(model: CausalLM, fixture: Fixture, affected: Stored, bystander: Stored) -> bool:
    store = SessionStore(fixture.backend, model_codecs(model), hot_bytes=0)
    try:
        other = store.get(bystander.name, namespace=NAMESPACE)
    except SeqKVError as error:
        raise AssertionError(f"session {bystander.name} failed: {error!r}") from error
    assert _same(other.tokens, other.kv, bystander), f"session {bystander.name} changed"
    got = store.get(affected.name, namespace=NAMESPACE)
    return _same(got.tokens, got.kv, affected)


def test_fuzz_span_records(fuzz_model: CausalLM, stored: Fixture) -> None:
    tally = CountingTally("store-records-structure")
    bytes_tally = CountingTally("store-records-bytes")
    rng = np.random.default_rng(seed(1000))
    spans = sorted({span for session in stored.sessions for span in session.spans})
    originals = {span: stored.path(span).read_bytes() for span in spans}
    for _ in range(case_count(25)):
        span = spans[int(rng.integers(0, len(spans)))]
        holders = [s for s in stored.sessions if span in s.spans]
        others = [s for s in stored.sessions if span not in s.spans]
        affected = holders[int(rng.integers(0, len(holders)))]
        bystander = others[int(rng.integers(0, len(others)))]
        structural, what, mutated = mutate_record(rng, originals[span])
        path = stored.path(span)
        path.write_bytes(mutated)
        try:
            (tally if structural else bytes_tally).run(
                f"span {span} ({affected.name}): {what}",
                partial(_attempt, fuzz_model, stored, affected, bystander))
        finally:
            path.write_bytes(originals[span])
    tally.check(RECORD_BUDGET)
    bytes_tally.check(RECORD_BUDGET)


def test_the_record_fields_cover_every_byte(stored: Fixture) -> None:
    residuals = 0
    for session in stored.sessions:
        for span in session.spans:
            record = stored.path(span).read_bytes()
            fields = record_fields(record)
            end = fields[-1].offset + fields[-1].length
            assert end == len(record) - 4
            residuals += any(f.name == "residual length" for f in fields)
    assert residuals >= 1  # the noisy session's span carries a residual section


def test_the_store_is_intact_after_fuzzing(fuzz_model: CausalLM, stored: Fixture) -> None:
    store = SessionStore(stored.backend, model_codecs(fuzz_model), hot_bytes=0)
    for session in stored.sessions:
        got = store.get(session.name, namespace=NAMESPACE)
        assert _same(got.tokens, got.kv, session)
    assert store.audit(namespace=NAMESPACE).consistent


def test_a_record_naming_another_parent_is_corrupt(fuzz_model: CausalLM, stored: Fixture) -> None:
    """Issue 17 (found by this suite): a record whose parent field (CRC-32 recomputed) is not
    the span before it in the store's chain failed an ``assert`` in ``_decode_chains``."""
    appended = next(s for s in stored.sessions if s.name == "appended")
    span = appended.spans[-1]
    path = stored.path(span)
    original = path.read_bytes()
    fields = {f.name: f for f in record_fields(original)}
    parent = fields["parent"]
    body = (original[: parent.offset] + bytes([99])
            + original[parent.offset + parent.length : -4])
    path.write_bytes(body + struct.pack("<I", zlib.crc32(body)))
    try:
        store = SessionStore(stored.backend, model_codecs(fuzz_model), hot_bytes=0)
        with pytest.raises(CorruptRecordError, match="names parent 99"):
            store.get("appended", namespace=NAMESPACE)
    finally:
        path.write_bytes(original)


def as_version_2(data: bytes) -> bytes:
    """A version-3 record as version 2 wrote it: no padding byte (the code's bytes are the
    same: its unused bits are zeros), the CRC recomputed."""
    record = read_span(data)
    fields = (record.codec, record.parent or 0, record.start, record.count)
    padding_at = 1 + sum(len(encode_varint(value)) for value in fields)
    body = bytes([2 << 4 | data[0] & 0x0F]) + data[1:padding_at] + data[padding_at + 1 : -4]
    return body + struct.pack("<I", zlib.crc32(body))


LEVELS = ["tokens", "rows", "segments:2", "ngram", "plain", "portable"]


@pytest.fixture(scope="module")
def at_every_level(fuzz_model: CausalLM,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    """One session per level, each a chain of two spans (a prefix session, then 10 tokens
    more)."""
    root = tmp_path_factory.mktemp("levels")
    store = SessionStore.directory(root, fuzz_model)
    for number, level in enumerate(LEVELS):
        tokens = [(13 * i + 7 * number + 3) % 500 for i in range(40)]
        store.put(f"{level}-head", tokens[:30], fuzz_model.prefill(tokens[:30]), level=level,
                  namespace=NAMESPACE)
        store.put(level, tokens, fuzz_model.prefill(tokens), level=level, namespace=NAMESPACE)
    store.close()
    backend = DirectoryBackend(root)
    yield Fixture(root, backend, _read_back(backend, fuzz_model, [
        name for level in LEVELS for name in (level, f"{level}-head")]))
    backend.close()


def test_fuzz_forged_counts_at_every_level(fuzz_model: CausalLM, at_every_level: Fixture) -> None:
    """Issue 44: a span record at each level whose count is forged (the CRC recomputed) past
    itself and to the model's context, its code kept, emptied or replaced, as a record of
    version 3 (whose decoder guards the code's information) or 2 (whose does not): the session
    holding it reads as put or ends in a ``SeqKVError``, within the budget; another session
    reads as put."""
    tally = CountingTally("store-records-forged-counts")
    rng = np.random.default_rng(seed(1100))
    context = fuzz_model.config.max_position_embeddings
    for session in at_every_level.sessions:
        span = session.spans[-1]
        bystander = next(s for s in at_every_level.sessions if span not in s.spans)
        path = at_every_level.path(span)
        original = path.read_bytes()
        record = read_span(original)
        for _ in range(case_count(3)):
            count = forged_count(rng, record.count, [context - record.start, 4096])
            what, code = forged_code(rng, record.token_code.data)
            forged = write_span(dataclasses.replace(record, count=count,
                                                    token_code=BitStream(code, 8 * len(code))))
            version = int(rng.choice([2, 3]))
            path.write_bytes(as_version_2(forged) if version == 2 else forged)
            try:
                tally.run(f"{session.name} (span {span}): record {version}, count {count:,}, "
                          f"{what}", partial(_attempt, fuzz_model, at_every_level, session,
                                             bystander))
            finally:
                path.write_bytes(original)
    tally.check(RECORD_BUDGET)

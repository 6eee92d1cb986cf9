"""The Redis scripts read a span record's parent as ``seqkv.formats.span.read_frame`` does.

The scripts parse records on the server (``seqkv.store.backends.redis``: ``parent_of`` on a
whole record in the chain walk, ``parent_at`` on a record's first bytes and its length in the
delete cascade and the audit). They run here on a real redis-server over records of every
version (3 by ``write_span``, 2 as that writer wrote them, 1 from the committed store of schema 1
and framed here) and over damaged forms of each: every truncation, byte changes in the fields
the scripts read, non-minimal and overlong varints. The scripts do not check the CRC (Python
does, on every record it reads), so each form is compared with ``read_frame`` of the same bytes
with the CRC made good: both must refuse it, or both must name the same parent.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import seqkv.store.backends.redis as redis_backend
from seqkv.coding.arithmetic import BitStream
from seqkv.digests import Digest
from seqkv.errors import SeqKVError
from seqkv.formats.framing import encode_varint
from seqkv.formats.span import SpanRecord, read_frame, read_span, write_span
from seqkv.limits import MAX_POSITIONS, MAX_VARINT
from seqkv.store.backends.redis_server import RedisServer

STORE_V1 = Path(__file__).parent / "data" / "store-v1"
TOKENS = Digest(bytes(range(8)))
KV = Digest(bytes(range(8, 16)))

_PROBE = """
local out = {}
for _, key in ipairs(KEYS) do
  local whole = redis.call('GET', key)
  local a, ok_a = parent_of(whole, #whole)
  local b, ok_b = parent_at(key)
  table.insert(out, (ok_a and 'ok:' .. (a or '') or 'no') .. '|' .. (ok_b and 'ok:' .. (b or '')
                                                                       or 'no'))
end
return out
"""


def _crc(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def _recrc(data: bytes) -> bytes:
    """``data`` with its last four bytes replaced by the CRC of the rest."""
    return _crc(data[:-4]) if len(data) >= 4 else data


def _v3(codec: int, parent: int | None, start: int, *, exact: bool = False,
        kv: bool = False, code: bytes = b"\x5a\x80") -> bytes:
    return write_span(SpanRecord(codec, parent, start, exact, 3, TOKENS, KV if kv else None,
                                 "ab" * 32 if kv else None, None,
                                 BitStream(code, 8 * len(code) - (1 if code else 0))))


def _as_version_2(data: bytes) -> bytes:
    """A version-3 record as version 2 wrote it: no padding byte, the CRC recomputed."""
    record = read_span(data)
    fields = (record.codec, record.parent or 0, record.start, record.count)
    padding_at = 1 + sum(len(encode_varint(value)) for value in fields)
    return _crc(bytes([2 << 4 | data[0] & 0x0F]) + data[1:padding_at] + data[padding_at + 1 : -4])


def _v1(codec: int, parent: int, start: int, flags: int, payload: bytes) -> bytes:
    return _crc(bytes([1 << 4 | flags]) + encode_varint(codec) + encode_varint(parent)
                + encode_varint(start) + payload)


def records() -> list[bytes]:
    """Well-formed records of versions 1, 2 and 3, their fixed fields small and at their
    bounds (a record of 22 header bytes: codec and parent of 8-byte varints, start of 5)."""
    v3 = [_v3(0, None, 0), _v3(1, 1, 5), _v3(300, 2 ** 40, 1 << 20, exact=True, kv=True),
          _v3(MAX_VARINT, MAX_VARINT, MAX_POSITIONS - 3, kv=True), _v3(7, 127, 128, code=b""),
          _v3(2, 128, 1, exact=True)]
    v1 = sorted(path.read_bytes() for path in STORE_V1.glob("*/records/*/*"))
    assert len(v1) == 7
    v1 += [_v1(0, 0, 0, 0, b"\x06" + bytes(16)), _v1(5, 2 ** 33, 12, 1, b"\x07" + bytes(20)),
           _v1(MAX_VARINT, MAX_VARINT, MAX_POSITIONS, 0, b"")]
    return [*v3, *(_as_version_2(r) for r in v3), *v1]


def damaged(record: bytes) -> Iterator[bytes]:
    """Forms of ``record`` with damage in what the scripts read, or around it."""
    yield from (record[:n] for n in range(len(record)))
    yield record[:-1] + bytes([record[-1] ^ 0x01])  # the CRC only
    for at in range(min(len(record) - 4, redis_backend.HEAD_BYTES + 2)):
        for value in {0x00, 0x7F, 0x80, 0xFF, record[at] ^ 0x01, record[at] ^ 0x80}:
            yield record[:at] + bytes([value]) + record[at + 1 :]
    for version in range(16):
        yield bytes([version << 4 | record[0] & 0x0F]) + record[1:]
    for flags in range(16):
        yield bytes([record[0] & 0xF0 | flags]) + record[1:]
    for at in range(1, min(len(record) - 4, 20)):  # a varint made longer than it must be
        if record[at] < 0x80:
            yield record[:at] + bytes([record[at] | 0x80, 0x00]) + record[at + 1 :]
    yield record[:1] + b"\xff" * 9 + record[1:]  # an integer of more than 8 bytes


def python_parent(data: bytes) -> str:
    try:
        frame = read_frame(data)
    except SeqKVError:
        return "no"
    return f"ok:{frame.parent or ''}"


def disagreements(client: redis.Redis, library: str) -> list[str]:
    """Each form where ``library``'s scripts and ``read_frame`` (the CRC made good) differ."""
    forms = sorted({form for record in records() for form in (record, *damaged(record))})
    keys = [f"lua-probe:{i}" for i in range(len(forms))]
    client.delete(*keys)
    client.mset(dict(zip(keys, forms, strict=True)))
    answers = client.eval(library + _PROBE, len(keys), *keys)
    client.delete(*keys)
    out = []
    for form, answer in zip(forms, answers, strict=True):
        expected = python_parent(_recrc(form))
        whole, head = answer.decode().split("|")
        if whole != expected or head != expected:
            out.append(f"{form.hex()}: read_frame {expected}, parent_of {whole}, "
                       f"parent_at {head}")
    return out


@pytest.fixture(scope="module")
def client(redis_server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(redis_server.url)


def test_the_forms_cover_every_version_and_both_verdicts() -> None:
    forms = [_recrc(f) for r in records() for f in (r, *damaged(r))]
    assert {read_frame(r).version for r in records()} == {1, 2, 3}
    verdicts = [python_parent(f) for f in forms]
    assert "no" in verdicts and len(set(verdicts)) > 10


def test_the_scripts_read_the_parent_as_read_frame_does(client: redis.Redis) -> None:
    assert disagreements(client, redis_backend._LIB) == []


@pytest.mark.parametrize(("old", "new"), [
    ("varint(head, 2, last)", "varint(head, 3, last)"),  # the parent read one byte late
    ("local last = math.min(#head, size - 4)", "local last = #head"),  # into the CRC
    ("(b == 0 and i > 1) or ", ""),  # a non-minimal varint accepted
    ("(version == 1 and flags > 1)", "false"),  # a version-1 record's flags unchecked
    ("start > MAXPOSITIONS or", "start > 2 ^ 53 or"),
    ("(parent == 0) ~= (start == 0)", "false"),
])
def test_a_script_that_reads_otherwise_fails(client: redis.Redis, old: str, new: str) -> None:
    library = redis_backend._LIB.replace("MAXPOSITIONS", str(MAX_POSITIONS))
    assert old.replace("MAXPOSITIONS", str(MAX_POSITIONS)) in library
    mutant = library.replace(old.replace("MAXPOSITIONS", str(MAX_POSITIONS)), new)
    assert disagreements(client, mutant)


def test_a_head_too_short_for_the_fields_fails(client: redis.Redis) -> None:
    """``parent_at`` reads ``HEAD_BYTES``; two varints' worth misses a long ``start``."""
    head = f"GETRANGE', key, 0, {redis_backend.HEAD_BYTES} - 1"
    assert head in redis_backend._LIB
    mutant = redis_backend._LIB.replace(head, f"GETRANGE', key, 0, {1 + 2 * 8} - 1")
    assert any("parent_at no" in d for d in disagreements(client, mutant))

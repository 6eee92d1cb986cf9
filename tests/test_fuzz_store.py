"""Fuzzing the store's metadata on both backends: each damage issue 29 found, one case each.

A span record carries the digests of its chain's tokens and KV, and every decode verifies them;
the metadata around the records (the session rows, the spans' parents, the codec table, the
database or the keys themselves) is what these cases damage. Each case copies a pristine store
(a directory copied, or a Redis prefix's keys restored under a new prefix), damages one thing a
rotting disk or a hand at ``sqlite3`` or ``redis-cli`` could change (a session row's span or
length, a row copied from another session or stripped of its binding, a span's parent looping,
a span missing, a record copied over, cut to one byte or of the wrong kind (and, in a directory,
a symbolic link to ``/dev/zero`` or a FIFO in a record's place: issue 44), a row's binding
switched off by the unbound mark of schema 1, or stripped under a schema mark set back to 1 or
removed (issue 44), text or non-UTF-8 where a number belongs, a codec description that is a JSON
list, a later schema), then reads the
affected session with a store that keeps nothing hot. The read must end in a ``SeqKVError``
within the harness's budget (2 s and 256 MiB per case, ``tests/test_fuzz_harness.py``): every
damage here changes what the session would read as, so its original output would be luck and
counts as a failure too.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import pytest
import torch

from fuzz_oracle import CountingTally
from seqkv.coding.arithmetic import BitStream
from seqkv.errors import SeqKVError
from seqkv.formats.span import read_span, write_span
from seqkv.limits import MODEL_FREE_MAX_TOKENS
from seqkv.models import CausalLM
from seqkv.store import SessionStore, TokensCodec, model_codecs
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.backends.redis import RedisBackend
from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.binding import STORE_SCHEMA, UNBOUND
from seqkv.store.ids import check_namespace, namespace_key
from test_fuzz_harness import (
    BUDGET,
    HOSTILE_INTEGERS,
    case_count,
    forged_code,
    forged_count,
    seed,
)
from test_fuzz_record import as_version_2

NAMESPACE = "fuzz"
NS_HEX = namespace_key(check_namespace(NAMESPACE)).hex()
KINDS = ["directory", "redis"]
A = [(11 * i + 5) % 500 for i in range(20)]
C = [(7 * i + 2) % 500 for i in range(20)]
SESSIONS = {"a": A, "b": [*A, 3, 1, 4, 1, 5, 9, 2, 6], "c": C, "d": C[:12]}


@dataclass(frozen=True)
class Original:
    tokens: list[int]
    kv: torch.Tensor


class Editor(Protocol):
    """Damages one copy of a store, whichever the backend."""

    def row(self, session: str) -> tuple[int, int, bytes | None]: ...

    def set_row(self, session: str, span: object, length: object, binding: object) -> None: ...

    def set_garbage_row(self, session: str) -> None: ...

    def set_parent(self, span: int, parent: int) -> None: ...

    def record(self, span: int) -> bytes: ...

    def write_record(self, span: int, data: bytes) -> None: ...

    def record_of_wrong_kind(self, span: int) -> None: ...

    def drop_span(self, span: int) -> None: ...

    def delete_record(self, span: int) -> None: ...

    def set_refcount(self, span: int, value: object) -> None: ...

    def set_index(self, value: object) -> None: ...

    def set_codec(self, description: str | bytes) -> None: ...

    def set_schema(self, version: str) -> None: ...

    def drop_schema(self) -> None: ...

    def wreck(self) -> None: ...

    def store(self, model: CausalLM) -> SessionStore: ...


class DirectoryEditor:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _sql(self, statement: str, *args: object) -> list[Any]:
        db = sqlite3.connect(self.root / "store.sqlite3", isolation_level=None)
        try:
            return db.execute(statement, args).fetchall()
        finally:
            db.close()

    def _path(self, span: int) -> Path:
        return self.root / "records" / f"{span % 256:02x}" / f"{span:x}"

    def row(self, session: str) -> tuple[int, int, bytes | None]:
        ((span, length, binding),) = self._sql(
            "SELECT span, length, binding FROM sessions WHERE name = ?", session)
        return span, length, binding

    def set_row(self, session: str, span: object, length: object, binding: object) -> None:
        self._sql("UPDATE sessions SET span = ?, length = ?, binding = ? WHERE name = ?",
                  span, length, binding, session)

    def set_garbage_row(self, session: str) -> None:
        self._sql("UPDATE sessions SET span = ?, length = ? WHERE name = ?", b"\xff\xfe",
                  b"\x80", session)

    def set_parent(self, span: int, parent: int) -> None:
        self._sql("UPDATE spans SET parent = ? WHERE id = ?", parent, span)

    def record(self, span: int) -> bytes:
        return self._path(span).read_bytes()

    def write_record(self, span: int, data: bytes) -> None:
        self._path(span).write_bytes(data)

    def record_of_wrong_kind(self, span: int) -> None:
        self._path(span).unlink()
        self._path(span).mkdir()

    def record_not_a_file(self, span: int, thing: str) -> None:
        """The record replaced by a symbolic link to ``/dev/zero`` or by a FIFO."""
        self._path(span).unlink()
        if thing == "FIFO":
            os.mkfifo(self._path(span))
        else:
            self._path(span).symlink_to("/dev/zero")

    def drop_span(self, span: int) -> None:
        self._sql("DELETE FROM spans WHERE id = ?", span)

    def delete_record(self, span: int) -> None:
        self._path(span).unlink()

    def set_refcount(self, span: int, value: object) -> None:
        self._sql("UPDATE spans SET refcount = ? WHERE id = ?", value, span)

    def set_index(self, value: object) -> None:
        self._sql("UPDATE idx SET span = ?", value)

    def set_codec(self, description: str | bytes) -> None:
        self._sql("UPDATE codecs SET description = ?", description)

    def set_schema(self, version: str) -> None:
        self._sql("UPDATE meta SET v = ? WHERE k = 'schema'", version)

    def drop_schema(self) -> None:
        self._sql("DELETE FROM meta WHERE k = 'schema'")

    def wreck(self) -> None:
        (self.root / "store.sqlite3").write_bytes(b"not a database " * 300)

    def store(self, model: CausalLM) -> SessionStore:
        return SessionStore(DirectoryBackend(self.root), model_codecs(model), hot_bytes=0)


class RedisEditor:
    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.client: Any = RedisBackend(url, prefix).client
        self.ns = f"{prefix}:{NS_HEX}"

    def row(self, session: str) -> tuple[int, int, bytes | None]:
        span, length, *binding = self.client.hget(f"{self.ns}:n", session).split(b":")
        return int(span), int(length), bytes.fromhex(binding[0].decode()) if binding else None

    def set_row(self, session: str, span: object, length: object, binding: object) -> None:
        """``binding`` None: no third field; ``UNBOUND``: the mark ``-``."""
        tail = ("" if binding is None else ":-" if binding == UNBOUND
                else ":" + bytes(binding).hex())  # type: ignore[call-overload]
        self.client.hset(f"{self.ns}:n", session, f"{span}:{length}{tail}")

    def set_garbage_row(self, session: str) -> None:
        self.client.hset(f"{self.ns}:n", session, b"\xff\xfe:\x80")

    def set_parent(self, span: int, parent: int) -> None:
        record = read_span(self.record(span))
        self.write_record(span, write_span(dataclasses.replace(
            record, parent=parent, start=record.start or 1)))

    def record(self, span: int) -> bytes:
        return bytes(self.client.get(f"{self.ns}:s:{span}"))

    def write_record(self, span: int, data: bytes) -> None:
        self.client.set(f"{self.ns}:s:{span}", data)

    def record_of_wrong_kind(self, span: int) -> None:
        self.client.delete(f"{self.ns}:s:{span}")
        self.client.hset(f"{self.ns}:s:{span}", "x", "y")

    def drop_span(self, span: int) -> None:
        self.client.delete(f"{self.ns}:s:{span}")
        self.client.hdel(f"{self.ns}:c", span)

    def delete_record(self, span: int) -> None:
        self.client.delete(f"{self.ns}:s:{span}")

    def set_refcount(self, span: int, value: object) -> None:
        self.client.hset(f"{self.ns}:c", span, value)

    def set_index(self, value: object) -> None:
        for bucket in self.client.scan_iter(match=f"{self.ns}:i:*"):
            for key in self.client.hkeys(bucket):
                self.client.hset(bucket, key, value)

    def set_codec(self, description: str | bytes) -> None:
        for index in self.client.hkeys(f"{self.prefix}:codecs"):
            self.client.hset(f"{self.prefix}:codecs", index, description)

    def set_schema(self, version: str) -> None:
        self.client.hset(f"{self.prefix}:meta", "schema", version)

    def drop_schema(self) -> None:
        self.client.hdel(f"{self.prefix}:meta", "schema")

    def wreck(self) -> None:
        self.client.delete(f"{self.ns}:n")
        self.client.set(f"{self.ns}:n", "not a hash")

    def store(self, model: CausalLM) -> SessionStore:
        return SessionStore(RedisBackend(self.url, self.prefix), model_codecs(model), hot_bytes=0)


@dataclass(frozen=True)
class Damage:
    """One damage: its name, the session it makes unreadable, and how to do it."""

    name: str
    session: str
    apply: Callable[[Editor], None]
    whole_store: bool = False  # the store does not open, or its audit fails as a whole
    kinds: tuple[str, ...] = ("directory", "redis")  # the backends that can hold it


def _set(session: str, *, span: Callable[[Editor], object] | None = None,
         length: Callable[[int], object] | None = None,
         binding: Literal["keep", "drop", "unbound"] = "keep",
         like: str | None = None) -> Callable[[Editor], None]:
    """A change of ``session``'s row: its span, its length, its binding kept, dropped or
    replaced by the unbound mark of schema 1, or the whole row of session ``like``."""

    def apply(editor: Editor) -> None:
        old_span, old_length, old_binding = editor.row(like or session)
        editor.set_row(session, old_span if span is None else span(editor),
                       old_length if length is None else length(old_length),
                       {"keep": old_binding, "drop": None, "unbound": UNBOUND}[binding])

    return apply


def _reset_schema(to: str | None) -> Callable[[Editor], None]:
    """b's binding stripped and its length lowered by 5, then the schema mark set to ``to``
    (None: removed), as if the store were of schema 1 and b one of its rows."""

    def apply(editor: Editor) -> None:
        _set("b", length=lambda n: n - 5, binding="drop")(editor)
        if to is None:
            editor.drop_schema()
        else:
            editor.set_schema(to)

    return apply


def _span_of(session: str) -> Callable[[Editor], int]:
    return lambda editor: editor.row(session)[0]


def _with_span(session: str, action: Callable[[Editor, int], None]) -> Callable[[Editor], None]:
    return lambda editor: action(editor, editor.row(session)[0])


def _copy_record(editor: Editor) -> None:
    editor.write_record(editor.row("a")[0], editor.record(editor.row("c")[0]))


def _forge_count(editor: Editor) -> None:
    """a's record claims 8,192 tokens (its CRC recomputed): past the model's context."""
    span = editor.row("a")[0]
    editor.write_record(span, write_span(dataclasses.replace(read_span(editor.record(span)),
                                                             count=8192)))


def _not_a_file(thing: str) -> Callable[[Editor], None]:
    def apply(editor: Editor) -> None:
        assert isinstance(editor, DirectoryEditor)
        editor.record_not_a_file(editor.row("a")[0], thing)

    return apply


def _two_cycle(editor: Editor) -> None:
    editor.set_parent(editor.row("a")[0], editor.row("b")[0])


DAMAGES = [
    Damage("length lowered by 5", "b", _set("b", length=lambda n: n - 5)),
    Damage("length 0", "b", _set("b", length=lambda n: 0)),
    Damage("length -1", "b", _set("b", length=lambda n: -1)),
    Damage("length raised past the chain", "a", _set("a", length=lambda n: n + 5)),
    Damage("length past the context", "a", _set("a", length=lambda n: 100_000)),
    Damage("span pointed at another session's span", "a", _set("a", span=_span_of("c"))),
    Damage("span pointed at its prefix's span", "b",
           _set("b", span=_span_of("a"), length=lambda n: len(A))),
    Damage("another span's record copied over", "a", _copy_record),
    Damage("row copied from another session", "a", _set("a", like="c")),
    Damage("row stripped of its binding", "a", _set("a", binding="drop")),
    Damage("another session's row without a binding", "a", _set("a", like="c", binding="drop")),
    Damage("binding switched off, length lowered by 5", "b",
           _set("b", length=lambda n: n - 5, binding="unbound")),
    Damage("binding switched off, span pointed at its prefix's span", "b",
           _set("b", span=_span_of("a"), length=lambda n: len(A), binding="unbound")),
    Damage("binding switched off on another session's row", "a",
           _set("a", like="c", binding="unbound")),
    Damage("binding stripped, schema mark set back to 1", "b", _reset_schema("1"), True),
    Damage("binding stripped, schema mark removed", "b", _reset_schema(None), True),
    Damage("self-cycle parent", "b", _with_span("a", lambda e, s: e.set_parent(s, s))),
    Damage("2-cycle parents", "b", _two_cycle),
    Damage("text in length", "a", _set("a", length=lambda n: "twenty")),
    Damage("text in span", "a", _set("a", span=lambda e: "x1")),
    Damage("non-UTF-8 row", "a", lambda editor: editor.set_garbage_row("a")),
    Damage("missing span", "b", _with_span("a", lambda e, s: e.drop_span(s))),
    Damage("record deleted, its span kept", "b",
           _with_span("a", lambda e, s: e.delete_record(s))),
    Damage("1-byte record", "a", _with_span("a", lambda e, s: e.write_record(s, b"\x02"))),
    Damage("record of the wrong kind", "a",
           _with_span("a", lambda e, s: e.record_of_wrong_kind(s))),
    Damage("record a symlink to /dev/zero", "b", _not_a_file("symlink"), kinds=("directory",)),
    Damage("record a FIFO", "b", _not_a_file("FIFO"), kinds=("directory",)),
    Damage("record count forged to 8192", "a", _forge_count),
    Damage("codec description a JSON list", "a", lambda editor: editor.set_codec("[1, 2]")),
    Damage("codec description nested 100000 deep", "a",
           lambda editor: editor.set_codec("[" * 100_000 + "]" * 100_000)),
    Damage("codec description not UTF-8", "a", lambda editor: editor.set_codec(b"\xff{\xfe")),
    Damage("a later schema", "a", lambda editor: editor.set_schema(str(STORE_SCHEMA + 1)), True),
    Damage("schema as text", "a", lambda editor: editor.set_schema("two"), True),
    Damage("database or keys of the wrong kind", "a", lambda editor: editor.wreck(), True),
]


def _originals(store: SessionStore) -> dict[str, Original]:
    out = {}
    for name in SESSIONS:
        got = store.get(name, namespace=NAMESPACE)
        assert got.kv is not None
        out[name] = Original(got.tokens, got.kv)
    return out


def _put_all(store: SessionStore, model: CausalLM) -> None:
    for name, tokens in SESSIONS.items():
        store.put(name, tokens, model.prefill(tokens), level="rows", namespace=NAMESPACE)


@dataclass(frozen=True)
class Pristine:
    """A store to copy per case, and what its sessions read as."""

    copy: Callable[[Path], Editor]
    originals: dict[str, Original]


@pytest.fixture(scope="module")
def pristine_directory(fuzz_model: CausalLM,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pristine]:
    root = tmp_path_factory.mktemp("pristine") / "store"
    store = SessionStore.directory(root, fuzz_model)
    _put_all(store, fuzz_model)
    store.close()
    reader = SessionStore(DirectoryBackend(root), model_codecs(fuzz_model), hot_bytes=0)
    originals = _originals(reader)
    reader.close()

    def copy(folder: Path) -> Editor:
        shutil.copytree(root, folder / "store")
        return DirectoryEditor(folder / "store")

    yield Pristine(copy, originals)


@pytest.fixture(scope="module")
def pristine_redis(fuzz_model: CausalLM, redis_server: RedisServer) -> Iterator[Pristine]:
    prefix = f"pristine{uuid.uuid4().hex[:8]}"
    store = SessionStore.redis(redis_server.url, fuzz_model, prefix=prefix)
    _put_all(store, fuzz_model)
    originals = _originals(SessionStore(RedisBackend(redis_server.url, prefix),
                                        model_codecs(fuzz_model), hot_bytes=0))
    client = store.backend.client  # type: ignore[attr-defined]

    def copy(folder: Path) -> Editor:
        target = f"case{uuid.uuid4().hex[:12]}"
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.restore(target.encode() + bytes(key)[len(prefix):], 0, client.dump(key))
        return RedisEditor(redis_server.url, target)

    yield Pristine(copy, originals)
    store.close()


def _attempt(model: CausalLM, editor: Editor, want: Original, session: str) -> bool:
    store = editor.store(model)
    try:
        got = store.get(session, namespace=NAMESPACE)
    finally:
        store.close()
    return got.tokens == want.tokens and got.kv is not None and torch.equal(got.kv, want.kv)


CASES = [pytest.param(kind, damage, id=f"{kind}-{damage.name.replace(' ', '-')}")
         for damage in DAMAGES for kind in KINDS if kind in damage.kinds]


@pytest.mark.parametrize(("kind", "damage"), CASES)
def test_store_metadata_damage(kind: str, damage: Damage, fuzz_model: CausalLM,
                               request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The damaged session is refused by a get, and named by a deep audit (unless the damage
    leaves no store to audit)."""
    pristine: Pristine = request.getfixturevalue(f"pristine_{kind}")
    editor = pristine.copy(tmp_path)
    damage.apply(editor)
    if not damage.whole_store:
        deep = editor.store(fuzz_model).audit_deep(namespace=NAMESPACE)
        assert damage.session in {d.session for d in deep.damaged}, deep
        assert not deep.consistent
    tally = CountingTally(f"metadata-{kind}-{damage.name.replace(' ', '-')}")
    tally.run(f"{kind}: {damage.name}", partial(_attempt, fuzz_model, editor,
                                                pristine.originals[damage.session],
                                                damage.session))
    tally.check(BUDGET)
    assert tally.outcomes["original output"] == 0, f"{damage.name} was not noticed"


@pytest.mark.parametrize("kind", KINDS)
def test_an_undamaged_copy_reads_back(kind: str, fuzz_model: CausalLM,
                                      request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The cases' copies are faithful: every session of an undamaged copy reads as put."""
    pristine: Pristine = request.getfixturevalue(f"pristine_{kind}")
    editor = pristine.copy(tmp_path)
    for name, want in pristine.originals.items():
        assert _attempt(fuzz_model, editor, want, name)
    assert editor.store(fuzz_model).audit(namespace=NAMESPACE).consistent


def _ends(call: Callable[[], object]) -> bool:
    """Any result is a good end for a verb on a damaged store; ``SeqKVError`` too (the
    tally counts it)."""
    call()
    return True


def _verbs(model: CausalLM, editor: Editor, session: str) -> dict[str, Callable[[], object]]:
    """Every store verb on a damaged copy, each on a store opened for it."""

    def run(action: Callable[[SessionStore], object]) -> Callable[[], object]:
        def call() -> object:
            store = editor.store(model)
            try:
                return action(store)
            finally:
                store.close()

        return call

    ns = NAMESPACE
    extended = [*SESSIONS[session], 8, 8, 8]
    return {
        "get_many": run(lambda s: s.get_many(list(SESSIONS), namespace=ns)),
        "stat": run(lambda s: s.stat(session, namespace=ns)),
        "list": run(lambda s: s.list(namespace=ns)),
        "audit": run(lambda s: s.audit(namespace=ns)),
        "audit_deep": run(lambda s: s.audit_deep(namespace=ns)),
        "byte_counts": run(lambda s: s.byte_counts(namespace=ns)),
        "put extending it": run(lambda s: s.put("new", extended, model.prefill(extended),
                                                level="rows", namespace=ns)),
        "append": run(lambda s: s.append(session, [8, 8], namespace=ns)),
        "gc": run(lambda s: s.gc(namespace=ns)),
        "delete": run(lambda s: s.delete(session, namespace=ns)),
    }


@pytest.mark.parametrize(("kind", "damage"), CASES)
def test_every_verb_on_a_damaged_store(kind: str, damage: Damage, fuzz_model: CausalLM,
                                       request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Whatever a verb does on a damaged store (refuse, or work around the damage), it ends in
    a ``SeqKVError`` or a result within the budget, never in another exception or a hang."""
    pristine: Pristine = request.getfixturevalue(f"pristine_{kind}")
    editor = pristine.copy(tmp_path)
    damage.apply(editor)
    tally = CountingTally(f"metadata-verbs-{kind}-{damage.name.replace(' ', '-')}")
    for verb, call in _verbs(fuzz_model, editor, damage.session).items():
        tally.run(f"{kind}: {damage.name}: {verb}", partial(_ends, call))
    tally.check(BUDGET)


def _hostile(rng: np.random.Generator, spans: list[int]) -> object:
    """A value for a damaged field: a hostile integer, another span's id, text or bytes."""
    choice = int(rng.integers(0, 4))
    if choice == 0:
        return int(HOSTILE_INTEGERS[int(rng.integers(0, len(HOSTILE_INTEGERS)))]) * int(
            rng.choice([1, -1]))
    if choice == 1:
        return spans[int(rng.integers(0, len(spans)))]
    if choice == 2:
        return str(rng.choice(["", "x", "1.5", "0x10", "٣", " 7"]))
    return bytes(rng.integers(0, 256, int(rng.integers(0, 6)), dtype=np.uint8))


def _random_damage(rng: np.random.Generator, editor: Editor) -> str:
    """One seeded damage of a row or a parent; what it did."""
    rows = {name: editor.row(name) for name in SESSIONS}
    spans = sorted({span for span, _, _ in rows.values()})
    name = list(SESSIONS)[int(rng.integers(0, len(SESSIONS)))]
    span, length, binding = rows[name]
    value = _hostile(rng, spans)
    field = str(rng.choice(["span", "length", "binding", "parent", "refcount", "index"]))
    if field == "span":
        editor.set_row(name, value, length, binding)
    elif field == "length":
        editor.set_row(name, span, value, binding)
    elif field == "binding":
        editor.set_row(name, span, length, value if isinstance(value, bytes) else None)
    elif field == "refcount":
        editor.set_refcount(span, value)
    elif field == "index":
        editor.set_index(value)
        return f"every index entry := {value!r}"
    elif isinstance(value, int) and 0 < value < 1 << 53:
        editor.set_parent(span, value)
    else:
        return _random_damage(rng, editor)
    return f"{name}'s {field} := {value!r}"


def _read_all(model: CausalLM, editor: Editor, originals: dict[str, Original]
              ) -> dict[str, bool | str]:
    """Each session read alone: True (as put), False (another output) or its error's class."""
    out: dict[str, bool | str] = {}
    for name, want in originals.items():
        try:
            out[name] = _attempt(model, editor, want, name)
        except SeqKVError as error:
            out[name] = type(error).__name__
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_fuzz_store_rows(kind: str, fuzz_model: CausalLM, request: pytest.FixtureRequest,
                         tmp_path: Path) -> None:
    """Seeded damage of a session row's span, length or binding, a span's parent or reference
    count, or the prefix index, by a hostile value: every session reads as put or ends in a
    ``SeqKVError``, a put extending one reads back as put (or ends in one), and a ``gc`` that
    runs never makes a session that read as put read otherwise."""
    pristine: Pristine = request.getfixturevalue(f"pristine_{kind}")
    rng = np.random.default_rng(seed(2900 + KINDS.index(kind)))
    tally = CountingTally(f"metadata-rows-{kind}")
    for case in range(case_count(12)):
        editor = pristine.copy(tmp_path / f"case{case}")
        what = _random_damage(rng, editor)

        def attempt(editor: Editor = editor) -> bool:
            before = _read_all(fuzz_model, editor, pristine.originals)
            assert False not in before.values(), f"a session read wrong: {before}"
            extended = [*SESSIONS["b"], 9, 9]
            try:
                put = editor.store(fuzz_model)
                put.put("new", extended, fuzz_model.prefill(extended), level="rows",
                        namespace=NAMESPACE)
            except SeqKVError:
                pass
            else:
                assert put.get("new", namespace=NAMESPACE).tokens == extended
            try:
                editor.store(fuzz_model).gc(namespace=NAMESPACE)
            except SeqKVError:
                return True
            after = _read_all(fuzz_model, editor, pristine.originals)
            lost = [n for n, ok in before.items() if ok is True and after[n] is not True]
            assert not lost, f"gc lost {lost}"
            return True

        tally.run(f"{kind}: {what}", attempt)
    tally.check(BUDGET)


@pytest.mark.parametrize("kind", KINDS)
def test_fuzz_forged_counts_on_a_tokens_only_store(kind: str, redis_server: RedisServer,
                                                   tmp_path: Path) -> None:
    """Issue 44: a tokens-only store (no model: no context bounds a count) at a vocabulary of
    2, sessions at ngram and plain; a record's count forged (the CRC recomputed) past itself
    and up to ``MODEL_FREE_MAX_TOKENS``, its code kept, emptied or replaced, as a record of
    version 3 or 2: the session reads as put or ends in a ``SeqKVError`` within the budget (a
    forged count of 2**17 at ngram decodes in full: a token may take next to no bits)."""
    backend = (DirectoryBackend(tmp_path / "store") if kind == "directory"
               else RedisBackend(redis_server.url, f"t{uuid.uuid4().hex[:10]}"))
    store = SessionStore(backend, lambda level: TokensCodec(2, level), hot_bytes=0)
    rng = np.random.default_rng(seed(3000 + KINDS.index(kind)))
    sessions = {level: [int(t) for t in rng.integers(0, 2, 64)] for level in ("ngram", "plain")}
    spans = {level: store.put(level, tokens, level=level, namespace=NAMESPACE).span
             for level, tokens in sessions.items()}
    editor: Editor = (RedisEditor(redis_server.url, backend._prefix)
                      if isinstance(backend, RedisBackend) else DirectoryEditor(tmp_path / "store"))
    tally = CountingTally(f"tokens-store-forged-counts-{kind}")
    for level, span in spans.items():
        original = editor.record(span)
        record = read_span(original)
        for _ in range(case_count(3)):
            count = forged_count(rng, record.count, [MODEL_FREE_MAX_TOKENS])
            what, code = forged_code(rng, record.token_code.data)
            forged = write_span(dataclasses.replace(record, count=count,
                                                    token_code=BitStream(code, 8 * len(code))))
            version = int(rng.choice([2, 3]))
            editor.write_record(span, as_version_2(forged) if version == 2 else forged)
            try:
                tally.run(f"{kind} {level}: record {version}, count {count:,}, {what}",
                          partial(lambda name: store.get(name, namespace=NAMESPACE).tokens
                                  == sessions[name], level))
            finally:
                editor.write_record(span, original)
    tally.check(BUDGET)
    assert [store.get(level, namespace=NAMESPACE).tokens for level in sessions] == list(
        sessions.values())

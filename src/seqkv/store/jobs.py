"""Fleet batch jobs: put and get many sessions from JSON lines, locally or through Ray Data.

Input lines are ``{"id": ..., "namespace": ..., "tokens": [...]}`` or ``{..., "text": "..."}``
(text needs a tokenizer: the store's model, or ``tokenize=``). ``get_many_jsonl`` reads lines
with ``id`` and ``namespace`` and writes one line per session: ``id``, ``namespace``, ``tokens``,
``kv_exact`` and, with a detokenizer, ``text``.

The Ray variants (``ray_put_many``, ``ray_get_many``; the optional extra ``ray[data]``, which
needs no torch of its own) run the same per-line work in actors, each opening the shared store
from a ``seqkv.store.fleet.StoreSpec`` and holding its own model, so a cluster writes one store.

Invariants:
1. A bad line raises ``BatchInputError`` naming its line number before anything of it is stored
   (enforced: every line is parsed before the first put).
2. ``get_many_jsonl`` decodes each namespace's sessions in batches of ``batch_size`` through
   ``SessionStore.get_many``, so sessions share model forwards (enforced).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqkv.progress import Progress, ProgressSink, tracked
from seqkv.store.codecs import DEFAULT_STORE_LEVEL
from seqkv.store.errors import BatchInputError
from seqkv.store.fleet import StoreSpec
from seqkv.store.ids import check_namespace, check_session_id
from seqkv.store.store import SessionStore

# NOTE: actors ask for half a CPU each: with a whole one, 2 actors on a 2-CPU Ray instance left no
# CPU for the read tasks that feed them, and the job hangs.
_ACTOR_CPUS = 0.5

Tokenize = Callable[[str], list[int]]
Detokenize = Callable[[list[int]], str]


@dataclass(frozen=True, slots=True)
class SessionLine:
    session: str
    namespace: str
    tokens: tuple[int, ...] | None
    text: str | None


@dataclass(frozen=True, slots=True)
class BatchReport:
    sessions: int
    tokens: int
    shared_tokens: int  # puts: tokens found stored and not coded again
    record_bytes: int  # puts: bytes added to the store
    seconds: float

    @property
    def sessions_per_second(self) -> float:
        return self.sessions / self.seconds if self.seconds > 0 else 0.0


def parse_line(raw: str, number: int, need_content: bool = True) -> SessionLine:
    """One JSON line as a ``SessionLine``, or ``BatchInputError`` naming the line."""
    try:
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError("a line must be a JSON object")
        session = check_session_id(value.get("id"))
        namespace = check_namespace(value.get("namespace"))
        tokens = value.get("tokens")
        text = value.get("text")
        if need_content and (tokens is None) == (text is None):
            raise ValueError('give exactly one of "tokens" and "text"')
        if tokens is not None and not (isinstance(tokens, list) and tokens
                                       and all(isinstance(t, int) and t >= 0 for t in tokens)):
            raise ValueError('"tokens" must be a non-empty list of token ids')
        if text is not None and not (isinstance(text, str) and text):
            raise ValueError('"text" must be a non-empty string')
    except (ValueError, TypeError) as error:
        raise BatchInputError(f"line {number}: {error}") from error
    return SessionLine(session, namespace, None if tokens is None else tuple(tokens), text)


def read_lines(path: str | os.PathLike[str], need_content: bool = True) -> list[SessionLine]:
    """Every non-blank line of ``path``, parsed (invariant 1)."""
    with open(path, encoding="utf-8") as stream:
        return [parse_line(raw, number, need_content)
                for number, raw in enumerate(stream, start=1) if raw.strip()]


def _tokens(line: SessionLine, tokenize: Tokenize | None) -> list[int]:
    if line.tokens is not None:
        return list(line.tokens)
    if tokenize is None:
        raise BatchInputError(f"session {line.session!r} is given as text, but there is no "
                              "tokenizer: pass tokenize= or give tokens")
    assert line.text is not None
    return tokenize(line.text)


def put_many_jsonl(store: SessionStore, path: str | os.PathLike[str], *,
                   level: str = DEFAULT_STORE_LEVEL, tokenize: Tokenize | None = None,
                   progress: ProgressSink | None = None) -> BatchReport:
    """Put every session of the JSON-lines file ``path``."""
    lines = read_lines(path)
    started = time.perf_counter()
    tokens = shared = stored = 0
    for line in tracked(lines, progress, "put", "session", len(lines)):
        result = store.put(line.session, _tokens(line, tokenize), level=level,
                           namespace=line.namespace)
        tokens += result.tokens
        shared += result.shared_tokens
        stored += result.record_bytes
    return BatchReport(len(lines), tokens, shared, stored, time.perf_counter() - started)


def _batches(lines: Sequence[SessionLine], size: int) -> Iterator[list[SessionLine]]:
    by_namespace: dict[str, list[SessionLine]] = {}
    for line in lines:
        by_namespace.setdefault(line.namespace, []).append(line)
    for group in by_namespace.values():
        for start in range(0, len(group), size):
            yield group[start : start + size]


def _row(session: str, namespace: str, tokens: list[int], kv_exact: bool,
         detokenize: Detokenize | None) -> dict[str, Any]:
    row: dict[str, Any] = {"id": session, "namespace": namespace, "tokens": tokens,
                           "kv_exact": kv_exact}
    if detokenize is not None:
        row["text"] = detokenize(tokens)
    return row


def get_many_jsonl(store: SessionStore, path: str | os.PathLike[str],
                   out: str | os.PathLike[str], *, batch_size: int = 16,
                   detokenize: Detokenize | None = None,
                   progress: ProgressSink | None = None) -> BatchReport:
    """Decode the sessions listed in ``path`` and write them as JSON lines to ``out``."""
    lines = read_lines(path, need_content=False)
    started = time.perf_counter()
    tokens = 0
    done = 0
    with open(Path(out), "w", encoding="utf-8") as sink:
        for batch in _batches(lines, batch_size):
            for got in store.get_many([line.session for line in batch],
                                      namespace=batch[0].namespace):
                tokens += len(got.tokens)
                sink.write(json.dumps(_row(got.session, got.namespace, got.tokens, got.kv_exact,
                                           detokenize)) + "\n")
            done += len(batch)
            if progress is not None:
                progress(Progress("get", done, len(lines), "session"))
    return BatchReport(len(lines), tokens, 0, 0, time.perf_counter() - started)


class _RayPutter:
    """A Ray actor: opens the shared store (and its model) once, puts batches of lines."""

    def __init__(self, spec: StoreSpec, level: str) -> None:
        self._store = spec.open()
        self._level = level
        self._tokenize: Tokenize | None = None
        if spec.codec == "default":
            from seqkv.models import load_default_model

            self._tokenize = load_default_model().encode_text

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        ids, shared, stored = [], [], []
        for index in range(len(batch["id"])):
            raw = {key: _plain(batch[key][index]) for key in batch}
            line = parse_line(json.dumps({k: v for k, v in raw.items() if v is not None}), index)
            result = self._store.put(line.session, _tokens(line, self._tokenize),
                                     level=self._level, namespace=line.namespace)
            ids.append(line.session)
            shared.append(result.shared_tokens)
            stored.append(result.record_bytes)
        return {"id": ids, "shared_tokens": shared, "record_bytes": stored}


class _RayGetter:
    """A Ray actor: decodes batches of sessions from the shared store."""

    def __init__(self, spec: StoreSpec) -> None:
        self._store = spec.open()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        namespaces = [str(n) for n in batch["namespace"]]
        out: dict[str, list[Any]] = {"id": [], "namespace": [], "tokens": [], "kv_exact": []}
        for namespace in dict.fromkeys(namespaces):
            names = [str(s) for s, n in zip(batch["id"], namespaces, strict=True)
                     if n == namespace]
            for got in self._store.get_many(names, namespace=namespace):
                out["id"].append(got.session)
                out["namespace"].append(got.namespace)
                out["tokens"].append(got.tokens)
                out["kv_exact"].append(got.kv_exact)
        return out


def _plain(value: Any) -> Any:
    """A numpy scalar or array from a Ray batch as plain JSON-able Python."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def ray_put_many(spec: StoreSpec, path: str | os.PathLike[str], *,
                 level: str = DEFAULT_STORE_LEVEL, actors: int = 2,
                 batch_size: int = 8) -> BatchReport:
    """``put_many_jsonl`` through Ray Data: ``actors`` actors write to the store ``spec``."""
    import ray.data

    read_lines(path)  # invariant 1: refuse a bad file before any actor starts
    started = time.perf_counter()
    rows = ray.data.read_json(str(path), lines=True).map_batches(
        _RayPutter, fn_constructor_args=(spec, level),
        compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=_ACTOR_CPUS,
        batch_size=batch_size, batch_format="numpy").take_all()
    return BatchReport(len(rows), 0, sum(int(r["shared_tokens"]) for r in rows),
                       sum(int(r["record_bytes"]) for r in rows), time.perf_counter() - started)


def ray_get_many(spec: StoreSpec, path: str | os.PathLike[str], out: str | os.PathLike[str], *,
                 actors: int = 2, batch_size: int = 8) -> BatchReport:
    """``get_many_jsonl`` through Ray Data; lines come back in any order."""
    import ray.data

    lines = read_lines(path, need_content=False)
    started = time.perf_counter()
    items = [{"id": line.session, "namespace": line.namespace} for line in lines]
    rows = ray.data.from_items(items).map_batches(
        _RayGetter, fn_constructor_args=(spec,),
        compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=_ACTOR_CPUS,
        batch_size=batch_size, batch_format="numpy").take_all()
    tokens = 0
    with open(Path(out), "w", encoding="utf-8") as sink:
        for row in rows:
            got = [int(t) for t in _plain(row["tokens"])]
            tokens += len(got)
            sink.write(json.dumps(_row(str(row["id"]), str(row["namespace"]), got,
                                       bool(row["kv_exact"]), None)) + "\n")
    return BatchReport(len(rows), tokens, 0, 0, time.perf_counter() - started)

"""Worker processes over a shared store: what the race and fault tests and the bench run.

A ``StoreSpec`` names a store (a directory or a Redis URL, and the codec) in a form that pickles,
so ``multiprocessing`` workers (spawned, never forked: torch and SQLite handles must not cross a
fork) each open their own. ``put_worker`` puts its sessions one by one and appends each session
id to an acknowledgement file, fsynced, only after ``put`` returned: after any crash, every id in
that file is an acknowledged put.

Invariants:
1. An id is written to the acknowledgement file only after its ``put`` returned (enforced).
2. A worker that loses its Redis server retries the put until the server is back; a put found to
   exist on retry (its reply was lost) is not acknowledged (enforced).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from seqkv.store.errors import SessionExistsError, StoreUnavailableError
from seqkv.store.registry import CodecFactory, model_codecs
from seqkv.store.store import SessionStore

CodecKind = Literal["portable", "tiny", "default"]


@dataclass(frozen=True)
class StoreSpec:
    """How to open a store in another process."""

    kind: Literal["directory", "redis"]
    location: str  # a directory, or redis://127.0.0.1:PORT/DB
    prefix: str = "skv"
    codec: CodecKind = "portable"
    vocab_size: int = 49152

    def codecs(self) -> CodecFactory:
        if self.codec == "portable":
            from seqkv.store.codecs import TokensCodec

            vocab = self.vocab_size
            return lambda level: TokensCodec(vocab, level)
        if self.codec == "tiny":
            from seqkv.models import tiny_random_llama

            return model_codecs(tiny_random_llama())
        from seqkv.models import load_default_model

        return model_codecs(load_default_model())

    def open(self) -> SessionStore:
        if self.kind == "directory":
            from seqkv.store.backends.directory import DirectoryBackend

            return SessionStore(DirectoryBackend(self.location), self.codecs())
        from seqkv.store.backends.redis import RedisBackend

        return SessionStore(RedisBackend(self.location, self.prefix), self.codecs())


@dataclass(frozen=True)
class PutJob:
    session: str
    namespace: str
    tokens: tuple[int, ...]
    level: str


def put_worker(spec: StoreSpec, jobs: Sequence[PutJob], ack_path: str,
               retry_seconds: float = 60.0, skip_existing: bool = False) -> None:
    """Put ``jobs`` in order, acknowledging each in ``ack_path`` (invariant 1).

    ``skip_existing``: a job whose session exists is skipped unacknowledged (a restarted worker
    resuming after a crash: its last put may have committed without an acknowledgement).
    """
    store: SessionStore | None = None
    with open(ack_path, "a", encoding="utf-8") as acks:
        for job in jobs:
            deadline = time.monotonic() + retry_seconds
            retried = False
            while True:
                try:
                    if store is None:
                        store = spec.open()
                    store.put(job.session, list(job.tokens), level=job.level,
                              namespace=job.namespace)
                except StoreUnavailableError:
                    if time.monotonic() > deadline:
                        raise
                    retried = True
                    store = None
                    time.sleep(0.05)
                    continue
                except SessionExistsError:
                    if not (retried or skip_existing):
                        raise
                    break  # committed before the server died; the reply was lost
                acks.write(job.session + "\n")
                acks.flush()
                os.fsync(acks.fileno())
                break


def read_acks(path: str | os.PathLike[str]) -> list[str]:
    """The acknowledged ids; a torn last line (the writer died mid-write) is not one."""
    file = Path(path)
    if not file.exists():
        return []
    text = file.read_text(encoding="utf-8")
    lines = text.split("\n")
    return [line for line in lines[:-1] if line]

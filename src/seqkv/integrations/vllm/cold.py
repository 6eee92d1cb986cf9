"""The cold tier: finished sessions' tokens into seqkv's exact session store, off the engine loop.

Motivation: the engine already knows a new request's prompt, so a token-coded session saves no
prefill on a hit; its value is keeping sessions that would otherwise be dropped (idle chats,
migrations, audit) at about half a byte per token, restorable exactly on any machine at the
``portable`` level. A cold-only hit is therefore reported to the engine as 0 tokens (the engine
recomputes); the session stays in the store, readable with ``SessionStore.get`` or
``seqkv store get``.

Invariants:
1. ``put`` returns at once; the coding runs on one background thread, in order (enforced).
2. A session id already taken in its namespace gets a numbered suffix, never overwrites
   (enforced: the store refuses duplicates; we retry with ``:2``, ``:3``, ...).
3. Failures are counted and kept for inspection, never raised into the engine (enforced).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from seqkv.errors import SeqKVError
from seqkv.integrations.vllm.background import BackgroundQueue
from seqkv.store import SessionExistsError, SessionStore

_MAX_SUFFIX = 100


@dataclass(frozen=True)
class ColdCounters:
    sessions: int
    tokens: int
    bytes: int
    failures: int


class ColdTier:
    """Queues sessions for ``store`` (see the module docstring)."""

    def __init__(self, store: SessionStore, level: str = "portable") -> None:
        self.store = store
        self.level = level
        self._queue = BackgroundQueue("seqkv-cold")
        self._lock = threading.Lock()
        self._sessions = self._tokens = self._bytes = 0
        self.errors: list[str] = []

    def put(self, session: str, tokens: Sequence[int], namespace: str) -> Future[str | None]:
        """Queue ``tokens``; the future gives the id stored under (``None`` on failure)."""
        token_list = [int(t) for t in tokens]
        return self._queue.submit(lambda: self._put(session, token_list, namespace))

    def _put(self, session: str, tokens: list[int], namespace: str) -> str | None:
        for attempt in range(1, _MAX_SUFFIX + 1):
            name = session if attempt == 1 else f"{session}:{attempt}"
            try:
                result = self.store.put(name, tokens, level=self.level, namespace=namespace)
            except SessionExistsError:
                continue
            except SeqKVError as error:
                with self._lock:
                    self.errors.append(f"{session}: {error}")
                return None
            with self._lock:
                self._sessions += 1
                self._tokens += len(tokens)
                self._bytes += result.record_bytes
            return name
        with self._lock:
            self.errors.append(f"{session}: {_MAX_SUFFIX} sessions of this id exist")
        return None

    def drain(self) -> None:
        self._queue.drain()

    def shutdown(self) -> None:
        self._queue.shutdown()

    def counters(self) -> ColdCounters:
        with self._lock:
            return ColdCounters(self._sessions, self._tokens, self._bytes, len(self.errors))

"""The cold tier: finished sessions' tokens into seqkv's exact session store, off the engine loop.

Motivation: the engine already knows a new request's prompt, so a token-coded session saves no
prefill on a hit; its value is keeping sessions that would otherwise be dropped (idle chats,
migrations, audit) at about half a byte per token, restorable exactly on any machine at the
``portable`` level. A cold-only hit is therefore reported to the engine as 0 tokens (the engine
recomputes); the session stays in the store, readable with ``SessionStore.get`` or
``seqkv store get``.

A put is only queued when the response is written (coding takes seconds to minutes on a slow
CPU), so the response says ``queued`` and the id reserved for the session, never ``stored``;
whether it was stored is in ``counters()``, the log (every cause of failure, once) and the
store itself (``seqkv store ls`` / ``stat``).

Backlog policy: at most ``max_pending`` sessions wait for coding; a put beyond that is dropped
at once (status ``dropped``, counted, logged once), never blocks the engine and never displaces
a session already queued, whose id the responses have named.

Invariants:
1. ``put`` returns at once; the coding runs on one background thread, in order (enforced).
2. The id a ticket names is the id the session is stored under, or the put fails: it is
   reserved at ``put`` (not held by the store nor by a queued put of this tier; an id taken
   gets a numbered suffix ``:2``, ``:3``, ...), and a store that meanwhile took it from another
   writer fails the put (``SessionExistsError``) rather than storing it elsewhere (enforced).
3. No failure is raised into the engine: every exception of a put (not only ``SeqKVError``) is
   counted by cause, logged once per cause with its traceback, and kept in a bounded record of
   the latest ``FAILURES_KEPT`` (enforced; checked by tests).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal

from seqkv.integrations.vllm.background import BackgroundQueue
from seqkv.limits import MAX_SESSION_NAME_SUFFIX
from seqkv.store import SessionStore

logger = logging.getLogger(__name__)

FAILURES_KEPT = 64
"""Latest failures kept in full (session, cause, message); older ones only counted."""
CAUSES_KEPT = 32
"""Distinct causes counted by name; further ones are counted under ``"other"``."""
DROPPED = "queue full"
"""The cause a put dropped by the backlog policy is counted under."""

ColdStatus = Literal["queued", "dropped", "failed"]


@dataclass(frozen=True)
class ColdTicket:
    """What ``put`` answers at once: the id reserved for the session and whether it is queued
    (``future`` gives the stored id, or ``None`` when the put failed)."""

    session: str
    status: ColdStatus
    future: Future[str | None] | None

    def params(self) -> dict[str, str]:
        """The response's cold-tier fields."""
        return {"seqkv_cold_session": self.session, "seqkv_cold_status": self.status}


@dataclass(frozen=True)
class ColdFailure:
    session: str
    namespace: str
    cause: str
    """The exception's class name, or ``DROPPED``."""
    message: str


@dataclass(frozen=True)
class ColdCounters:
    queued: int
    """Puts accepted into the queue."""
    sessions: int
    """Sessions stored."""
    tokens: int
    bytes: int
    failures: int
    """Puts that failed, dropped ones included."""
    dropped: int
    pending: int
    """Queued, not yet stored or failed."""
    causes: tuple[tuple[str, int], ...]
    """Failures per cause, in the order first seen."""


class ColdTier:
    """Queues sessions for ``store`` (see the module docstring)."""

    def __init__(self, store: SessionStore, level: str = "portable",
                 max_pending: int = 64) -> None:
        self.store = store
        self.level = level
        self.max_pending = max_pending
        self._queue = BackgroundQueue("seqkv-cold")
        self._lock = threading.Lock()
        self._reserved: set[tuple[str, str]] = set()
        self._queued = self._sessions = self._tokens = self._bytes = 0
        self._failures = self._dropped = 0
        self._causes: dict[str, int] = {}
        self.failures: deque[ColdFailure] = deque(maxlen=FAILURES_KEPT)
        """The latest failures, oldest first."""

    def put(self, session: str, tokens: Sequence[int], namespace: str) -> ColdTicket:
        """Reserve an id for ``tokens`` and queue them (never raises: see invariant 3)."""
        token_list = [int(t) for t in tokens]
        if self._queue.pending >= self.max_pending:
            self._record(session, namespace, DROPPED,
                         f"{self.max_pending} sessions wait for coding; this one is dropped",
                         None)
            with self._lock:
                self._dropped += 1
            return ColdTicket(session, "dropped", None)
        try:
            name = self._reserve(session, namespace)
        except Exception as error:  # invariant 3: nothing reaches the engine
            self._record(session, namespace, type(error).__name__, str(error), error)
            return ColdTicket(session, "failed", None)
        with self._lock:
            self._queued += 1
        future = self._queue.submit(lambda: self._put(name, token_list, namespace))
        return ColdTicket(name, "queued", future)

    def _reserve(self, session: str, namespace: str) -> str:
        for attempt in range(1, MAX_SESSION_NAME_SUFFIX + 1):
            name = session if attempt == 1 else f"{session}:{attempt}"
            with self._lock:
                if (namespace, name) in self._reserved:
                    continue
            if self.store.exists(name, namespace=namespace):
                continue
            with self._lock:
                self._reserved.add((namespace, name))
            return name
        raise ValueError(f"{MAX_SESSION_NAME_SUFFIX} sessions of id {session!r} exist")

    def _put(self, name: str, tokens: list[int], namespace: str) -> str | None:
        try:
            result = self.store.put(name, tokens, level=self.level, namespace=namespace)
        except Exception as error:  # invariant 3
            self._record(name, namespace, type(error).__name__, str(error), error)
            return None
        finally:
            with self._lock:
                self._reserved.discard((namespace, name))
        with self._lock:
            self._sessions += 1
            self._tokens += len(tokens)
            self._bytes += result.record_bytes
        return name

    def _record(self, session: str, namespace: str, cause: str, message: str,
                error: BaseException | None) -> None:
        with self._lock:
            self._failures += 1
            if cause not in self._causes and len(self._causes) >= CAUSES_KEPT:
                cause = "other"
            first = cause not in self._causes
            self._causes[cause] = self._causes.get(cause, 0) + 1
            self.failures.append(ColdFailure(session, namespace, cause, message))
        if first:
            logger.error("seqkv cold tier: session %r (namespace %r) not stored: %s: %s; "
                         "further failures of this cause are counted, not logged",
                         session, namespace, cause, message, exc_info=error)

    def drain(self) -> None:
        self._queue.drain()

    def shutdown(self) -> None:
        self._queue.shutdown()

    def counters(self) -> ColdCounters:
        pending = self._queue.pending
        with self._lock:
            return ColdCounters(self._queued, self._sessions, self._tokens, self._bytes,
                                self._failures, self._dropped, pending,
                                tuple(self._causes.items()))

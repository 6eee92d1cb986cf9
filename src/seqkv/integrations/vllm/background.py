"""One background thread that runs queued work in order, off the engine's loop.

Both tiers code on such a thread (the warm tier its blocks after each step, the cold tier a
finished session), so neither stalls vLLM's scheduler or forward.

Invariants:
1. ``submit`` returns at once; work runs in submission order on one thread (enforced:
   a one-worker executor).
2. ``drain`` returns after everything submitted before it finished, and re-raises the first
   failure (enforced).
3. ``pending`` counts submitted work not yet finished; any thread may read it (enforced: a
   lock around the list of futures).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

_Result = TypeVar("_Result")


class BackgroundQueue:
    """Work queued for one thread named ``name``; ``initializer`` runs on it first."""

    def __init__(self, name: str, initializer: Callable[[], None] | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name,
                                            initializer=initializer)
        self._futures: list[Future[object]] = []
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], _Result]) -> Future[_Result]:
        future = self._executor.submit(work)
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(future)  # type: ignore[arg-type]
        return future

    @property
    def pending(self) -> int:
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            return len(self._futures)

    def drain(self) -> None:
        """Wait for everything queued (tests, benchmarks, shutdown)."""
        with self._lock:
            futures, self._futures = self._futures, []
        for future in futures:
            future.result()

    def shutdown(self) -> None:
        self.drain()
        self._executor.shutdown(wait=True)

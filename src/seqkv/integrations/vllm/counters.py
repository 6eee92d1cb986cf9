"""The connector's counters in the engine's log, at a fixed interval.

vLLM's metrics registry has no hook for an out-of-tree connector's own figures, so each side
logs its counters (``seqkv.integrations.vllm.counters``, level INFO) from a hook the engine
calls every step: the scheduler side from ``build_connector_meta`` (matches, planned loads and
saves, finished requests, and the cold tier's queued, stored, failed and dropped puts), the
worker side from ``wait_for_save`` (loaded and saved blocks and bytes, load errors, dropped
saves, evictions, damaged entries deleted). A line is written when at least
``counters_log_seconds`` passed since the last one (setting; 0 turns it off), and once more at
shutdown, so a short run still reports.

Invariants:
1. A tick reads the counters only when it writes a line (enforced): between lines it costs one
   clock read.
2. The line is ``seqkv connector <side>: key=value ...`` with the counters' field names, in
   their declared order (checked by a test).
3. The line at shutdown (``close``) is written after the side's queues drained, also when a
   drain raises (enforced; checked by a test with a mutant).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

_LOG = logging.getLogger(__name__)


class CounterLog:
    """Logs ``read()``'s counters (dataclasses) at most every ``interval`` seconds."""

    def __init__(self, side: str, read: Callable[[], Sequence[object]], interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.side = side
        self._read = read
        self._interval = interval
        self._clock = clock
        self._last = clock()

    def tick(self) -> None:
        """From a hook the engine calls every step: a line when the interval has passed."""
        if self._interval <= 0:
            return
        now = self._clock()
        if now - self._last >= self._interval:
            self._last = now
            self.flush()

    def close(self, *drains: Callable[[], None]) -> None:
        """At shutdown: run ``drains`` (the queues' shutdowns, which wait for queued work),
        then write the last line, which so counts all the work that ended (invariant 3)."""
        try:
            for drain in drains:
                drain()
        finally:
            self.flush()

    def flush(self) -> None:
        """A line now, unless the log is off."""
        if self._interval <= 0:
            return
        fields = []
        for counters in self._read():
            prefix = type(counters).__name__.removesuffix("Counters").lower()
            for field in dataclasses.fields(counters):  # type: ignore[arg-type]
                value = getattr(counters, field.name)
                if isinstance(value, float):
                    value = f"{value:.3f}"
                elif isinstance(value, tuple):
                    value = ",".join(f"{cause}:{count}" for cause, count in value) or "-"
                fields.append(f"{prefix}.{field.name}={value}")
        _LOG.info("seqkv connector %s: %s", self.side, " ".join(fields))

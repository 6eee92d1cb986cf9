"""How many threads the integer forward's decode steps run on: the faster count, measured.

Motivation: ``native.c`` shares each layer's output blocks between OpenMP threads, and a step
waits at the end of every parallel region for its slowest thread. On a quiet 2-core machine two
threads run a one-row step of SmolLM2-135M in 10.5-15 ms against 17-22 ms on one; while another
process keeps one core busy, the thread that shares that core is descheduled for whole time
slices and the other waits for it at every region: a single-session decode fell from ~70 to ~11
tokens/s in a bench run here. One thread on the free core loses only the second thread's share.
Which count is faster depends on what else the machine runs, and changes while a decode runs, so
a decode measures its own steps: ``ThreadPolicy`` keeps a smoothed step time per candidate count,
runs the faster one, and tries the other every ``explore_every`` steps.

The integer forward's rows are bit-identical on any thread count (``tests/test_integer_*.py``),
so the policy changes only the speed, never a decoded token.

Invariants:
1. ``choose`` returns one of ``counts``; every count is measured before the policy compares them,
   and each non-best count is run at least once every ``explore_every`` steps (enforced).
2. A step is recorded only as a like-for-like sample: the caller records steps of one row per
   stream, never a step that verified drafts (enforced by ``levels/portable.py``).
3. The thread count never changes the rows (checked: the integer exactness tests).

``SEQKV_INTEGER_THREADS`` fixes the count (a positive integer) instead of measuring; ``adaptive``
(the default) measures. Nothing here mutates state outside the policy object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from seqkv.errors import InvalidConfigError

THREADS_ENV = "SEQKV_INTEGER_THREADS"
# NOTE: native.c on SmolLM2-135M: two threads beat one on a quiet 2-core machine; more than the
# cores the process may use never helps.
MAX_NATIVE_THREADS = 2
# NOTE: one step in this many runs a count that is not the current best: at ~15 ms a step that is
# one probe every ~0.25 s, so a decode notices a competing process appearing or leaving within
# a fraction of a second, and a probe of the slow count costs under 1/16 of the decode.
EXPLORE_EVERY = 16
SMOOTHING = 0.3  # weight of the newest step in a count's smoothed time


@dataclass
class ThreadPolicy:
    """The thread count of each decode step: the one with the smaller smoothed step time."""

    counts: tuple[int, ...]
    explore_every: int = EXPLORE_EVERY
    smoothing: float = SMOOTHING
    seconds: dict[int, float] = field(default_factory=dict)
    _steps: int = 0
    _explored: int = 0

    def __post_init__(self) -> None:
        if not self.counts or any(c < 1 for c in self.counts):
            raise InvalidConfigError(f"thread counts must be positive, not {self.counts}")

    def best(self) -> int:
        """The measured count with the smallest smoothed step time (the first count before
        any is measured)."""
        measured = [c for c in self.counts if c in self.seconds]
        if not measured:
            return self.counts[0]
        return min(measured, key=lambda c: self.seconds[c])

    def choose(self) -> int:
        """The count the next step runs on (invariant 1)."""
        self._steps += 1
        unmeasured = [c for c in self.counts if c not in self.seconds]
        if unmeasured:
            return unmeasured[0]
        best = self.best()
        others = [c for c in self.counts if c != best]
        if others and self._steps % self.explore_every == 0:
            self._explored += 1
            return others[self._explored % len(others)]
        return best

    def record(self, threads: int, seconds: float) -> None:
        """A like-for-like step (invariant 2) ran on ``threads`` in ``seconds``."""
        previous = self.seconds.get(threads)
        self.seconds[threads] = (seconds if previous is None else
                                 previous + self.smoothing * (seconds - previous))


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def decode_policy(native: bool) -> ThreadPolicy:
    """The policy of one decode: fixed by ``SEQKV_INTEGER_THREADS``, else one thread on the
    torch path (its ``_int_mm`` workers stall under load alike, and it is not the fast path)
    and the measured choice of 1 to ``MAX_NATIVE_THREADS`` on ``native.c``.

    >>> decode_policy(native=False).counts
    (1,)
    """
    setting = os.environ.get(THREADS_ENV, "adaptive").strip()
    if setting != "adaptive":
        if not setting.isascii() or not setting.isdigit() or int(setting) < 1:
            raise InvalidConfigError(f"{THREADS_ENV} must be 'adaptive' or a positive "
                                       f"integer, not {setting!r}")
        return ThreadPolicy((int(setting),))
    if not native:
        return ThreadPolicy((1,))
    top = max(1, min(MAX_NATIVE_THREADS, usable_cores()))
    return ThreadPolicy(tuple(range(top, 0, -1)))

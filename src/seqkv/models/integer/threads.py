"""How many threads the integer forward's decode steps run on: the faster count, measured.

Motivation: ``native.c`` shares each layer's output blocks between OpenMP threads, and a step
waits at the end of every parallel region for its slowest thread. On a quiet machine two
threads run a one-row step faster than one; while another process keeps one core busy, the
thread that shares that core is descheduled for whole time slices and the other waits for it at
every region, and a decode runs several times slower. One thread on the free core loses only
the second thread's share.
Which count is faster depends on what else the machine runs, and changes while a decode runs, so
a decode measures its own steps: ``ThreadPolicy`` keeps a smoothed step time per candidate count,
runs the faster one, and tries the other every ``explore_every`` steps.

A probe of more threads than the machine has free cores is not run: beside a competing
process a 2-thread step usually costs 2-3x a 1-thread one, and at random a whole scheduler slice
more, so before it runs a count above one the policy reads
the machine's runnable threads (``procs_running`` in Linux's ``/proc/stat``, one read per probe)
and, while the cores are busy, treats the probe as a slow one without running it. Where that
count cannot be read, timing alone decides.

The integer forward's rows are bit-identical on any thread count (``tests/test_integer_*.py``),
so the policy changes only the speed, never a decoded token.

Invariants:
1. ``choose`` returns one of ``counts``; a count above one runs only while the machine has a
   free core for each of its threads beyond the first (or its load cannot be read); each
   non-best count is probed (or found not to fit) at most ``max_explore_every`` steps after
   the last probe, and within ``explore_every`` steps while the last probe was within
   ``BACKOFF_RATIO`` of the best (enforced).
2. A step is recorded only as a like-for-like sample: the caller records steps of one row per
   stream, never a step that verified drafts (enforced by ``levels/portable.py``).
3. The thread count never changes the rows (checked: the integer exactness tests).

``SEQKV_INTEGER_THREADS`` fixes the count (a positive integer) instead of measuring; ``adaptive``
(the default) measures. Nothing here mutates state outside the policy object.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from seqkv.errors import InvalidConfigError

THREADS_ENV = "SEQKV_INTEGER_THREADS"
# NOTE: native.c on SmolLM2-135M: two threads beat one on a quiet 2-core machine; more than the
# cores the process may use never helps.
MAX_NATIVE_THREADS = 2
# NOTE: one step in this many runs a count that is not the current best: a decode notices a
# competing process appearing or leaving within a few dozen steps, and a probe of the slow count
# costs under 1/16 of the decode.
EXPLORE_EVERY = 16
SMOOTHING = 0.3  # weight of the newest step in a count's smoothed time
# NOTE: a probe that ran this much slower than the best doubles the steps until the next one,
# up to MAX_EXPLORE_EVERY: beside a competing process a 2-thread probe step costs about 3x a
# 1-thread step, so probing every 16th step costs about 1/8 of a loaded decode (benchmarks/
# decode_under_load.py); at 128 steps it is under 2%, and the decode still notices the
# competing process leaving within a few hundred steps.
BACKOFF_RATIO = 1.5
MAX_EXPLORE_EVERY = 128


def others_running() -> int | None:
    """Threads of other processes runnable on the machine now: Linux's ``procs_running`` less
    this process's own running threads (the reader, and OpenMP workers still spinning after a
    parallel region, which would otherwise read as a competing process); None where it cannot
    be read."""
    try:
        with open("/proc/stat", "rb") as stat:
            running = next((int(line.split()[1]) for line in stat
                            if line.startswith(b"procs_running ")), None)
        if running is None:
            return None
        own = 0
        for task in os.scandir("/proc/self/task"):
            try:
                with open(os.path.join(task.path, "stat"), "rb") as status:
                    fields = status.read()
            except OSError:  # the thread ended
                continue
            own += fields[fields.rindex(b")") + 2 : fields.rindex(b")") + 3] == b"R"
        return max(0, running - own)
    except (OSError, ValueError, IndexError):
        return None


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class ThreadPolicy:
    """The thread count of each decode step: the one with the smaller smoothed step time."""

    counts: tuple[int, ...]
    explore_every: int = EXPLORE_EVERY
    max_explore_every: int = MAX_EXPLORE_EVERY
    smoothing: float = SMOOTHING
    seconds: dict[int, float] = field(default_factory=dict)
    cores: int = field(default_factory=usable_cores)
    load: Callable[[], int | None] = others_running  # runnable threads besides this one
    _steps: int = 0  # steps since the last probe
    _explored: int = 0
    _interval: int = 0  # steps between probes now: explore_every, doubled by slow probes
    _probing: int | None = None  # the count the last probe ran, until it is recorded

    def __post_init__(self) -> None:
        if not self.counts or any(c < 1 for c in self.counts):
            raise InvalidConfigError(f"thread counts must be positive, not {self.counts}")
        if not 1 <= self.explore_every <= self.max_explore_every:
            raise InvalidConfigError("probe intervals must satisfy 1 <= explore_every <= "
                                     f"max_explore_every, not {self.explore_every} and "
                                     f"{self.max_explore_every}")
        self._interval = self.explore_every

    def best(self) -> int:
        """The measured count with the smallest smoothed step time (the first count before
        any is measured)."""
        measured = [c for c in self.counts if c in self.seconds]
        if not measured:
            return self.counts[0]
        return min(measured, key=lambda c: self.seconds[c])

    def fits(self, threads: int) -> bool:
        """Whether ``threads`` would each have a core now (one thread always does)."""
        if threads <= 1:
            return True
        others = self.load()
        return others is None or threads + others <= self.cores

    def first(self) -> int:
        """The count a decode's first forward runs on: the first of ``counts`` that fits."""
        return next((c for c in self.counts if self.fits(c)), min(self.counts))

    def choose(self) -> int:
        """The count the next step runs on (invariant 1)."""
        self._steps += 1
        if not self.seconds:
            return self.first()
        best = self.best()
        others = [c for c in self.counts if c != best]
        unmeasured = [c for c in others if c not in self.seconds]
        due = self._steps >= self._interval or (unmeasured and self._explored == 0)
        if not others or not due:
            return best
        self._steps = 0
        self._explored += 1
        candidate = unmeasured[0] if unmeasured else others[self._explored % len(others)]
        if not self.fits(candidate):  # as a slow probe, without running it
            self._interval = min(2 * self._interval, self.max_explore_every)
            return best
        self._probing = candidate
        return candidate

    def record(self, threads: int, seconds: float) -> None:
        """A like-for-like step (invariant 2) ran on ``threads`` in ``seconds``."""
        if threads == self._probing:
            self._probing = None
            best = self.seconds.get(self.best())
            slow = best is not None and threads != self.best() and (
                seconds > BACKOFF_RATIO * best)
            self._interval = (min(2 * self._interval, self.max_explore_every) if slow
                              else self.explore_every)
        previous = self.seconds.get(threads)
        self.seconds[threads] = (seconds if previous is None else
                                 previous + self.smoothing * (seconds - previous))


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

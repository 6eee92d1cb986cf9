"""Progress as events: what long operations emit, and what a front end renders.

The library never draws: a level, a batch job or a bench emits ``Progress`` events to the sink
its caller passed (or to none), and the caller decides what to show: the CLI renders bars on a
terminal, plain lines or JSON lines elsewhere (``seqkv.cli.common.Reporter``). An event is cheap
to emit; a sink that renders throttles itself.

Invariants:
1. Emitting never changes a result (enforced: sinks return nothing and the emitters ignore
   them).
2. This module imports only the standard library (enforced by ``tests/test_layering.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Progress:
    """``done`` of ``total`` (None: unknown) ``unit``s of ``task`` are done."""

    task: str
    done: int
    total: int | None
    unit: str


class ProgressSink(Protocol):
    """Where a long operation reports how far it got."""

    def __call__(self, event: Progress) -> None: ...


def tracked(items: Iterable[T], sink: ProgressSink | None, task: str, unit: str,
            total: int | None = None) -> Iterator[T]:
    """``items`` unchanged, reporting each one done to ``sink`` (nothing without a sink).

    >>> seen = []
    >>> list(tracked("ab", seen.append, "reading", "letter", 2))
    ['a', 'b']
    >>> [(e.done, e.total) for e in seen]
    [(0, 2), (1, 2), (2, 2)]
    """
    if sink is None:
        yield from items
        return
    done = 0
    sink(Progress(task, done, total, unit))
    for item in items:
        yield item
        done += 1
        sink(Progress(task, done, total, unit))

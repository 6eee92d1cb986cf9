"""The bookkeeping shared by the two batched forwards' KV pools: the float row-invariant forward
(``seqkv.models.rows``) and the integer forward (``seqkv.models.integer.forward``).

Motivation: both engines keep many sequences in one pool buffer (one slot a sequence), append a
call's tokens to each sequence, write every new key and value with one indexed write per pool,
and hand back each sequence's logit rows. Only the buffer layouts and the arithmetic differ; the
bookkeeping below was written twice, once per engine, and lives here once.

Invariants:
1. ``grown`` keeps every held value at its index and only ever enlarges the buffer, doubling its
   capacity until it holds ``length`` positions (enforced).
2. ``pool_writes`` lists rows, slots and positions in the order of the spans, grouped by pool in
   the order pools first appear (enforced): the engines' writes depend on that order only
   through which pool gets which rows.
3. ``finish_call`` advances each sequence by its chunk and splits the logit rows in call order
   (enforced); nothing here touches a pool's values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import torch

_Pool = TypeVar("_Pool")
_Scalar = TypeVar("_Scalar", bound=np.generic)


class GrowingSequence(Protocol):
    """A sequence of a pool: how many positions it holds."""

    length: int


def grown(buffer: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """``buffer`` with room for ``length`` positions along ``dim``: itself when it has it, else
    a zero buffer of twice, four times, ... its capacity holding the old values first.

    >>> grown(torch.ones(1, 2), 1, 3).tolist()
    [[1.0, 1.0, 0.0, 0.0]]
    """
    capacity = old = buffer.shape[dim]
    if length <= capacity:
        return buffer
    assert capacity > 0, "a pool holds room for at least one position"
    while capacity < length:
        capacity *= 2
    shape = list(buffer.shape)
    shape[dim] = capacity
    result = buffer.new_zeros(shape)
    result.narrow(dim, 0, old).copy_(buffer)
    return result


def require_distinct(sequences: Iterable[object]) -> None:
    """Refuse a call that names one sequence twice (each appends at its own next positions)."""
    listed = list(sequences)
    if len({id(sequence) for sequence in listed}) != len(listed):
        raise ValueError("a sequence may appear only once in a forward")


@dataclass(frozen=True)
class PoolWrites(Generic[_Pool]):
    """Where one pool's rows of a forward go: rows of the call, slots, positions."""

    pool: _Pool
    rows: torch.Tensor  # [R] long
    slots: torch.Tensor  # [R] long
    positions: torch.Tensor  # [R] long


def pool_writes(
    entries: Iterable[tuple[_Pool, int, int, int, int]], device: torch.device
) -> list[PoolWrites[_Pool]]:
    """Group ``(pool, slot, first row, rows, first position)`` spans by pool: for each pool, the
    rows of the call, the slots and the positions they are written to."""
    grouped: dict[int, tuple[_Pool, list[int], list[int], list[int]]] = {}
    for pool, slot, start, count, position in entries:
        _, rows, slots, positions = grouped.setdefault(id(pool), (pool, [], [], []))
        rows.extend(range(start, start + count))
        slots.extend([slot] * count)
        positions.extend(range(position, position + count))
    def as_tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return [PoolWrites(pool, as_tensor(rows), as_tensor(slots), as_tensor(positions))
            for pool, rows, slots, positions in grouped.values()]


def finish_call(
    calls: Sequence[tuple[GrowingSequence, Sequence[int]]], logits: npt.NDArray[_Scalar]
) -> list[npt.NDArray[_Scalar]]:
    """Advance every sequence by its chunk and split ``logits`` (one row per id, in call order)
    into each call's rows."""
    for sequence, chunk in calls:
        sequence.length += len(chunk)
    result: list[npt.NDArray[_Scalar]] = []
    offset = 0
    for _, chunk in calls:
        result.append(logits[offset : offset + len(chunk)])
        offset += len(chunk)
    return result

"""The KV pool bookkeeping both batched forwards share (``seqkv.models.pools``)."""

from __future__ import annotations

import doctest
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from seqkv.models import pools
from seqkv.models.pools import finish_call, grown, pool_writes, require_distinct


def test_doctests() -> None:
    result = doctest.testmod(pools)
    assert result.attempted > 0 and result.failed == 0


def test_grown_keeps_a_buffer_that_has_room() -> None:
    buffer = torch.ones(2, 4, 3)
    assert grown(buffer, 1, 4) is buffer


def test_grown_doubles_until_it_fits_and_keeps_the_values() -> None:
    buffer = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)  # capacity 3 on dim 1
    result = grown(buffer, 1, 10)  # 3 -> 6 -> 12
    assert result.shape == (2, 12, 2)
    assert torch.equal(result[:, :3], buffer)
    assert not result[:, 3:].any()


def test_pool_writes_group_by_pool_in_first_seen_order() -> None:
    a, b = object(), object()
    writes = pool_writes([(a, 1, 0, 2, 5), (b, 0, 2, 1, 0), (a, 3, 3, 1, 7)],
                         torch.device("cpu"))
    assert [w.pool for w in writes] == [a, b]
    first = writes[0]
    assert (first.rows.tolist(), first.slots.tolist(), first.positions.tolist()) == (
        [0, 1, 3], [1, 1, 3], [5, 6, 7])
    assert first.rows.dtype == torch.long


@dataclass
class _Sequence:
    length: int


def test_finish_call_advances_and_splits_in_call_order() -> None:
    first, second = _Sequence(4), _Sequence(0)
    logits = np.arange(5 * 2).reshape(5, 2)
    parts = finish_call([(first, [1, 2, 3]), (second, [7, 8])], logits)
    assert (first.length, second.length) == (7, 2)
    assert [p.tolist() for p in parts] == [logits[:3].tolist(), logits[3:].tolist()]


def test_a_sequence_named_twice_is_refused() -> None:
    sequence = _Sequence(0)
    with pytest.raises(ValueError, match="only once"):
        require_distinct([sequence, sequence])

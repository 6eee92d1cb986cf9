"""The schedule probes on the tiny random Llama: what they compare, and their preconditions."""

from __future__ import annotations

import numpy as np
import pytest

from research.decoding import probes
from seqkv.models import CausalLM, Stepper
from seqkv.models.rows import row_forward
from seqkv.schedule import pinned_threads

TOKENS = [int(t) for t in np.random.default_rng(0).integers(0, 512, 24)]


def test_compare_rows_counts_bit_identical_rows() -> None:
    a = np.zeros((3, 4), dtype=np.float32)
    b = a.copy()
    b[1, 2] = np.float32(1e-7)
    result = probes.compare_rows("x", a, b)
    assert (result.rows, result.identical, result.bit_identical) == (3, 2, False)
    assert result.max_abs_diff == pytest.approx(1e-7)
    assert probes.compare_rows("same", a, a).bit_identical


def test_single_position_chunks_are_the_codecs_steps(tiny_model: CausalLM) -> None:
    rows = probes.schedule_rows(tiny_model, TOKENS, probes.chunk_sizes(len(TOKENS), 1))
    stepper = Stepper(tiny_model.model)
    with pinned_threads():
        steps = np.stack([stepper.step(t) for t in TOKENS])
    assert probes.compare_rows("steps", rows, steps).bit_identical


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8, 24])
def test_rows_do_not_depend_on_later_tokens(tiny_model: CausalLM, chunk: int) -> None:
    # The premise of research.decoding.blocked, on this backend.
    result = probes.later_token_independence(tiny_model, TOKENS, chunk, seed=chunk)
    assert result.chunks == -(-len(TOKENS) // chunk)
    assert result.bit_identical


def test_batch_invariance_compares_what_it_says(tiny_model: CausalLM) -> None:
    sessions = [[int(t) for t in np.random.default_rng(i).integers(3, 512, 12)]
                for i in range(4)]
    results = probes.batch_invariance(tiny_model, sessions, [1, 2, 4], paddings=(1, 3))
    cases = {r.case: r for r in results}
    # 3 batch sizes vs alone, 2 vs the largest; 4 padded batches vs alone, 2 vs the largest
    # padded alike, 2 vs the first padding. Nothing is compared with itself.
    assert len(cases) == len(results) == 3 + 2 + 4 + 2 + 2
    assert "equal lengths, batch 4 vs batch 4" not in cases
    assert cases["equal lengths, batch 2 vs batch 4"].rows == 12
    assert cases["padded by 3, batch 2 vs batch 4 padded by 3"].rows == 12 - 3
    assert cases["equal lengths, batch 1 vs alone"].bit_identical  # a batch of 1 is alone
    assert cases["padded by 1, batch 2 vs alone"].rows == 12 - 3


def test_batch_invariance_needs_enough_sessions(tiny_model: CausalLM) -> None:
    with pytest.raises(ValueError, match="sessions of one length"):
        probes.batch_invariance(tiny_model, [TOKENS, TOKENS], [1, 4])


def test_batch_invariance_needs_long_enough_sessions(tiny_model: CausalLM) -> None:
    with pytest.raises(ValueError, match="shorter than the sessions"):
        probes.batch_invariance(tiny_model, [TOKENS[:4]] * 4, [4], paddings=(2, 4))


def test_schedule_kv_of_single_positions_is_the_codecs(tiny_model: CausalLM) -> None:
    stepper = Stepper(tiny_model.model)
    with pinned_threads():
        for token in TOKENS:
            stepper.step(token)
    kv = probes.schedule_kv(tiny_model, TOKENS, [1] * len(TOKENS))
    assert kv.equal(tiny_model.kv_tensor(stepper.cache))
    assert kv.shape == (2, 2, 2, len(TOKENS), 16)


def test_linear_row_invariance_covers_every_weight_shape(tiny_model: CausalLM) -> None:
    results = probes.linear_row_invariance(tiny_model, max_rows=6)
    shapes = {(r.out_features, r.in_features) for r in results}
    assert shapes == {(32, 64), (64, 64), (64, 128), (128, 64), (512, 64)}
    # The row-invariant forward's calibrated block: every product of at least that many rows
    # gives each row the bits of a larger one, on this machine.
    block = row_forward(tiny_model).row_block
    assert all(set(range(block, 7)) <= set(r.identical_row_counts) for r in results)


def test_chunk_sizes_cover_the_positions() -> None:
    assert probes.chunk_sizes(10, 4, first=3) == [3, 4, 3]
    assert probes.chunk_sizes(2, 4, first=3) == [2]


def test_chunk_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        probes.chunk_sizes(10, 0)


def test_timings_and_traffic(tiny_model: CausalLM) -> None:
    chunks = probes.chunk_timings(tiny_model, TOKENS, [1, 4], repeats=2)
    batches = probes.batch_timings(tiny_model, TOKENS, [1, 3], repeats=2)
    assert [(t.kind, t.size, t.context) for t in chunks + batches] == [
        ("chunk", 1, 24), ("chunk", 4, 24), ("batch", 1, 24), ("batch", 3, 24)]
    assert all(t.seconds > 0 for t in chunks + batches)
    parameters = {p.data_ptr(): p.numel() for p in tiny_model.model.parameters()}
    assert probes.weight_bytes(tiny_model) == 4 * sum(parameters.values())
    assert probes.read_bandwidth(megabytes=8, repeats=2) > 0

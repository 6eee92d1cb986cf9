"""The row-invariant forward: every row bit-identical however rows are chunked or batched."""

from __future__ import annotations

import itertools
import multiprocessing
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import UnsupportedModelError
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.models import rows as rows_module
from seqkv.models.rows import RowForward, row_forward
from seqkv.schedule import pinned_threads

TOKENS = [int(t) for t in np.random.default_rng(0).integers(3, 512, 48)]


def _one_chunk(engine: RowForward, tokens: list[int]) -> tuple[np.ndarray, torch.Tensor]:
    sequence = engine.new_sequence()
    rows = engine.forward([(sequence, tokens)])[0]
    return rows, sequence.kv()


@pytest.fixture(scope="module")
def engine(tiny_model: CausalLM) -> RowForward:
    return row_forward(tiny_model)


@given(cuts=st.lists(st.integers(1, 47), max_size=8, unique=True),
       threads=st.sampled_from([1, 2]))
def test_any_chunking_gives_the_rows_of_one_chunk(engine: RowForward, cuts: list[int],
                                                  threads: int) -> None:
    with pinned_threads(1):
        reference, kv = _one_chunk(engine, TOKENS)
    bounds = [0, *sorted(cuts), len(TOKENS)]
    sequence = engine.new_sequence()
    with pinned_threads(threads):
        rows = np.concatenate([engine.forward([(sequence, TOKENS[a:b])])[0]
                               for a, b in itertools.pairwise(bounds)])
    assert np.array_equal(rows, reference)
    assert torch.equal(sequence.kv(), kv)


@given(others=st.lists(st.lists(st.integers(3, 511), min_size=0, max_size=6), max_size=5),
       slot=st.integers(0, 5), threads=st.sampled_from([1, 2]))
def test_rows_do_not_depend_on_the_other_sequences_in_a_forward(
    engine: RowForward, others: list[list[int]], slot: int, threads: int
) -> None:
    with pinned_threads(1):
        reference, _ = _one_chunk(engine, TOKENS)
    sequence = engine.new_sequence()
    rows = []
    for start in range(0, len(TOKENS), 5):
        calls = [(engine.new_sequence(), ids) for ids in others]
        position = min(slot, len(calls))
        calls.insert(position, (sequence, TOKENS[start : start + 5]))
        with pinned_threads(threads):
            rows.append(engine.forward(calls)[position])
    assert np.array_equal(np.concatenate(rows), reference)


def test_rows_do_not_depend_on_the_thread_count(engine: RowForward) -> None:
    with pinned_threads(1):
        one, kv_one = _one_chunk(engine, TOKENS)
    with pinned_threads(2):
        two, kv_two = _one_chunk(engine, TOKENS)
    assert np.array_equal(one, two)
    assert torch.equal(kv_one, kv_two)


def _serial_and_shared(engine: RowForward, tokens: list[int], helper_threads: int,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One forward with its per-row attention calls on one thread, then shared with the helper
    thread left on ``helper_threads`` intra-op threads: the same rows and KV, bit for bit."""
    monkeypatch.setattr(rows_module, "PARALLEL_ATTENTION_KEYS", 10**12)
    serial, kv_serial = _one_chunk(engine, tokens)
    monkeypatch.setattr(rows_module, "PARALLEL_ATTENTION_KEYS", 0)
    rows_module._attention_helper().submit(torch.set_num_threads, helper_threads).result()
    shared, kv_shared = _one_chunk(engine, tokens)
    assert np.array_equal(shared, serial)
    assert torch.equal(kv_shared, kv_serial)


def test_sharing_attention_with_the_helper_thread_keeps_every_bit(
    engine: RowForward, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = [int(t) for t in np.random.default_rng(1).integers(3, 512, 300)]
    _serial_and_shared(engine, tokens, 1, monkeypatch)


def _forward_in_child(engine: RowForward, tokens: list[int], done: Any) -> None:
    done.put(_one_chunk(engine, tokens)[0].tobytes())


def test_a_forked_process_gets_its_own_attention_helper(
    engine: RowForward, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the parent's helper exists (and ran) before the fork; the child's forward must not wait on
    # a thread that was not forked with it
    tokens = [int(t) for t in np.random.default_rng(3).integers(3, 512, 200)]
    monkeypatch.setattr(rows_module, "PARALLEL_ATTENTION_KEYS", 0)
    expected = _one_chunk(engine, tokens)[0].tobytes()
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    child = context.Process(target=_forward_in_child, args=(engine, tokens, done))
    child.start()
    try:
        rows = done.get(timeout=60)  # before join: a child exits once its queue is drained
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    assert rows == expected
    assert child.exitcode == 0


@pytest.mark.real_model
def test_real_model_attention_helper_runs_on_one_thread(
    real_model: CausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # at the real geometry (3 KV heads x 64) torch's attention changes bits on 2 threads from a
    # few hundred keys on: a helper that kept 2 intra-op threads would leak them into the rows
    tokens = [int(t) for t in np.random.default_rng(2).integers(3, 49_000, 300)]
    _serial_and_shared(row_forward(real_model), tokens, 2, monkeypatch)


def test_crop_then_forward_equals_never_having_forwarded(engine: RowForward) -> None:
    reference, kv = _one_chunk(engine, TOKENS)
    sequence = engine.new_sequence()
    engine.forward([(sequence, [*TOKENS[:20], 7, 8, 9])])  # three wrong guesses
    sequence.crop(20)
    rows = engine.forward([(sequence, TOKENS[20:])])[0]
    assert np.array_equal(rows, reference[20:])
    assert torch.equal(sequence.kv(), kv)


def test_a_sequence_started_from_stored_kv_continues_it(engine: RowForward) -> None:
    reference, kv = _one_chunk(engine, TOKENS)
    sequence = engine.new_sequence(kv[:, :, :, :30])
    assert np.array_equal(engine.forward([(sequence, TOKENS[30:])])[0], reference[30:])


def test_rows_match_transformers_within_float_noise(tiny_model: CausalLM,
                                                    engine: RowForward) -> None:
    reference, _ = _one_chunk(engine, TOKENS)
    with torch.inference_mode():
        logits = tiny_model.model(input_ids=torch.tensor([TOKENS])).logits[0].numpy()
    assert np.abs(logits - reference).max() < 1e-4
    assert len(reference) >= engine.row_block


def test_a_sequence_may_appear_once_per_forward(engine: RowForward) -> None:
    sequence = engine.new_sequence()
    with pytest.raises(ValueError, match="once"):
        engine.forward([(sequence, [5]), (sequence, [6])])


def test_models_without_a_backbone_are_refused() -> None:
    model = tiny_random_llama()
    model.config.model_type = "gpt2"
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        RowForward(model)


@pytest.mark.real_model
def test_real_model_rows_are_invariant(real_model: CausalLM) -> None:
    engine = row_forward(real_model)
    tokens = real_model.encode_text("The keeper lit the lamp at dusk and wrote the hour down.")
    with pinned_threads(2):
        reference, kv = _one_chunk(engine, tokens)
    with pinned_threads(1):
        sequence = engine.new_sequence()
        other = engine.new_sequence()
        rows = [engine.forward([(other, [t]), (sequence, [t])])[1] for t in tokens]
    assert np.array_equal(np.concatenate(rows), reference)
    assert torch.equal(sequence.kv(), kv)

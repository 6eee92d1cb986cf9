"""The integer forward: bit-identical rows for any schedule, batch, slot and thread count."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM

from seqkv.errors import InvalidTokensError, UnsupportedModelError
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.models.integer import (
    LOGIT_FRAC,
    IntegerConfig,
    IntegerForward,
    IntegerWeights,
    integer_tables,
)
from seqkv.models.integer.forward import int_matmul
from seqkv.schedule import pinned_threads

TOKENS = [int(t) for t in np.random.default_rng(0).integers(3, 512, 48)]


def _one_chunk(engine: IntegerForward, tokens: list[int]) -> tuple[np.ndarray, torch.Tensor]:
    sequence = engine.new_sequence()
    rows = engine.forward([(sequence, tokens)])[0]
    return rows, sequence.state().planes


@pytest.fixture(scope="module")
def engine(tiny_model: CausalLM) -> IntegerForward:
    return IntegerForward(tiny_model)


@pytest.fixture(scope="module")
def reference(engine: IntegerForward) -> tuple[np.ndarray, torch.Tensor]:
    with pinned_threads(1):
        return _one_chunk(engine, TOKENS)


@given(cuts=st.lists(st.integers(1, 47), max_size=8, unique=True),
       threads=st.sampled_from([1, 2]))
def test_any_chunking_gives_the_rows_of_one_prefill(
    engine: IntegerForward, reference: tuple[np.ndarray, torch.Tensor], cuts: list[int],
    threads: int
) -> None:
    rows, planes = reference
    bounds = [0, *sorted(cuts), len(TOKENS)]
    sequence = engine.new_sequence()
    with pinned_threads(threads):
        chunks = [engine.forward([(sequence, TOKENS[a:b])])[0]
                  for a, b in itertools.pairwise(bounds)]
    assert np.array_equal(np.concatenate(chunks), rows)
    assert torch.equal(sequence.state().planes, planes)


def test_token_by_token_steps_give_the_rows_of_one_prefill(
    engine: IntegerForward, reference: tuple[np.ndarray, torch.Tensor]
) -> None:
    sequence = engine.new_sequence()
    steps = np.concatenate([engine.forward([(sequence, [t])])[0] for t in TOKENS])
    assert np.array_equal(steps, reference[0])


@given(others=st.lists(st.lists(st.integers(3, 511), min_size=0, max_size=7), max_size=5),
       slot=st.integers(0, 5), step=st.integers(1, 9), shared=st.booleans(),
       threads=st.sampled_from([1, 2]))
def test_rows_do_not_depend_on_the_other_sequences_in_a_forward(
    engine: IntegerForward, reference: tuple[np.ndarray, torch.Tensor],
    others: list[list[int]], slot: int, step: int, shared: bool, threads: int
) -> None:
    # the sequence under test sits in a random slot, in a shared pool or its own
    pool = engine.new_batch(len(others) + 1) if shared else None
    position = min(slot, len(others))
    sequence = pool[position] if pool else engine.new_sequence()
    mates = [s for i, s in enumerate(pool) if i != position] if pool else [
        engine.new_sequence() for _ in others]
    rows = []
    for start in range(0, len(TOKENS), step):
        calls = [(mate, ids) for mate, ids in zip(mates, others, strict=True)]
        calls.insert(position, (sequence, TOKENS[start : start + step]))
        with pinned_threads(threads):
            rows.append(engine.forward(calls)[position])
    assert np.array_equal(np.concatenate(rows), reference[0])


def test_rows_do_not_depend_on_the_thread_count(engine: IntegerForward) -> None:
    with pinned_threads(1):
        one, planes_one = _one_chunk(engine, TOKENS)
    with pinned_threads(2):
        two, planes_two = _one_chunk(engine, TOKENS)
    assert np.array_equal(one, two)
    assert torch.equal(planes_one, planes_two)


def test_thread_pinning_restores_the_thread_count(engine: IntegerForward) -> None:
    before = torch.get_num_threads()
    with pinned_threads(1):
        _one_chunk(engine, TOKENS[:5])
    assert torch.get_num_threads() == before


def test_crop_then_forward_equals_never_having_forwarded(
    engine: IntegerForward, reference: tuple[np.ndarray, torch.Tensor]
) -> None:
    sequence = engine.new_sequence()
    engine.forward([(sequence, [*TOKENS[:20], 7, 8, 9])])  # three wrong guesses
    sequence.crop(20)
    rows = engine.forward([(sequence, TOKENS[20:])])[0]
    assert np.array_equal(rows, reference[0][20:])
    assert torch.equal(sequence.state().planes, reference[1])


def test_a_copy_and_a_state_continue_the_sequence(
    engine: IntegerForward, reference: tuple[np.ndarray, torch.Tensor]
) -> None:
    sequence = engine.new_sequence()
    engine.forward([(sequence, TOKENS[:30])])
    twin = sequence.copy()
    restarted = engine.new_sequence(sequence.state())
    for other in (sequence, twin, restarted):
        assert np.array_equal(engine.forward([(other, TOKENS[30:])])[0], reference[0][30:])


def test_the_start_row_is_the_first_row_of_any_prefill(engine: IntegerForward) -> None:
    row = engine.start_row(TOKENS[0])
    assert np.array_equal(row, _one_chunk(engine, TOKENS[:3])[0][0])
    assert not row.flags.writeable


def test_tables_of_a_prefill_equal_those_of_steps(
    engine: IntegerForward, reference: tuple[np.ndarray, torch.Tensor]
) -> None:
    sequence = engine.new_sequence()
    steps = np.concatenate([engine.forward([(sequence, [t])])[0] for t in TOKENS[:10]])
    assert np.array_equal(integer_tables(steps)[0], integer_tables(reference[0][:10])[0])


def test_rows_are_close_to_the_float_model(
    tiny_model: CausalLM, reference: tuple[np.ndarray, torch.Tensor]
) -> None:
    """Bound: int8 weight rows dominate, about 1% of the tiny model's logit scale (~0.7);
    measured 0.0058."""
    with torch.inference_mode():
        logits = tiny_model.model(input_ids=torch.tensor([TOKENS])).logits[0].numpy()
    assert np.abs(reference[0] / 2**LOGIT_FRAC - logits).max() < 0.02


def test_fifteen_bit_weights_are_closer_to_the_float_model(
    tiny_model: CausalLM, reference: tuple[np.ndarray, torch.Tensor]
) -> None:
    fine = IntegerForward(tiny_model, config=IntegerConfig(weight_planes=2))
    rows = _one_chunk(fine, TOKENS)[0]
    with torch.inference_mode():
        logits = tiny_model.model(input_ids=torch.tensor([TOKENS])).logits[0].numpy()
    error = np.abs(rows / 2**LOGIT_FRAC - logits).max()
    assert error < 0.002
    assert error < np.abs(reference[0] / 2**LOGIT_FRAC - logits).max() / 4
    sequence = fine.new_sequence()
    steps = np.concatenate([fine.forward([(sequence, [t])])[0] for t in TOKENS[:8]])
    assert np.array_equal(steps, rows[:8])


def test_int8_activations_are_invariant_and_further_from_float(
    tiny_model: CausalLM, reference: tuple[np.ndarray, torch.Tensor]
) -> None:
    coarse = IntegerForward(tiny_model, config=IntegerConfig(activation_planes=1))
    rows = _one_chunk(coarse, TOKENS)[0]
    sequence = coarse.new_sequence()
    steps = np.concatenate([coarse.forward([(sequence, [t])])[0] for t in TOKENS[:8]])
    assert np.array_equal(steps, rows[:8])
    with torch.inference_mode():
        logits = tiny_model.model(input_ids=torch.tensor([TOKENS])).logits[0].numpy()
    error = np.abs(rows / 2**LOGIT_FRAC - logits).max()
    assert np.abs(reference[0] / 2**LOGIT_FRAC - logits).max() < error < 0.1
    assert coarse.digest != IntegerForward(tiny_model).digest


def test_truncated_predictors_are_invariant_too(tiny_model: CausalLM,
                                                engine: IntegerForward) -> None:
    short = IntegerForward(engine.weights, layers=1)
    rows = _one_chunk(short, TOKENS)[0]
    sequence = short.new_sequence()
    steps = np.concatenate([short.forward([(sequence, [t])])[0] for t in TOKENS[:8]])
    assert np.array_equal(steps, rows[:8])
    assert not np.array_equal(rows, _one_chunk(engine, TOKENS)[0])
    assert short.digest != engine.digest


def test_the_digest_is_a_function_of_weights_and_config(tiny_model: CausalLM,
                                                        engine: IntegerForward) -> None:
    assert IntegerForward(tiny_random_llama(seed=0)).digest == engine.digest
    assert IntegerForward(tiny_random_llama(seed=1)).digest != engine.digest
    two_planes = IntegerWeights.from_model(tiny_model, IntegerConfig(weight_planes=2))
    assert two_planes.digest() != engine.weights.digest()


@given(st.integers(1, 40), st.integers(1, 70), st.integers(1, 50), st.integers(0, 2**32))
def test_padding_for_cuda_keeps_every_integer_sum(m: int, k: int, n: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=generator)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=generator).t()
    expected = a.to(torch.int64) @ b.to(torch.int64)
    assert torch.equal(int_matmul(a, b, pad=True).to(torch.int64), expected)
    assert torch.equal(int_matmul(a, b).to(torch.int64), expected)


def test_a_sequence_may_appear_once_per_forward(engine: IntegerForward) -> None:
    sequence = engine.new_sequence()
    with pytest.raises(ValueError, match="once"):
        engine.forward([(sequence, [5]), (sequence, [6])])


def test_tokens_outside_the_vocabulary_are_refused(engine: IntegerForward) -> None:
    with pytest.raises(InvalidTokensError, match="vocabulary"):
        engine.forward([(engine.new_sequence(), [5, 512])])


def test_sequences_longer_than_the_model_are_refused(engine: IntegerForward) -> None:
    sequence = engine.new_sequence()
    with pytest.raises(InvalidTokensError, match="positions"):
        engine.forward([(sequence, [5] * (engine.max_positions + 1))])


def test_crop_only_shortens(engine: IntegerForward) -> None:
    sequence = engine.new_sequence()
    engine.forward([(sequence, [5, 6])])
    with pytest.raises(ValueError, match="only shortens"):
        sequence.crop(3)


def test_layer_counts_outside_the_model_are_refused(engine: IntegerForward) -> None:
    with pytest.raises(ValueError, match="layers"):
        IntegerForward(engine.weights, layers=3)


def test_models_other_than_the_llama_family_are_refused() -> None:
    model = tiny_random_llama()
    model.config.model_type = "gpt2"
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        IntegerForward(model)


def test_scaled_rotary_embeddings_are_refused() -> None:
    model = tiny_random_llama()
    model.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0}
    with pytest.raises(UnsupportedModelError, match="llama3"):
        IntegerForward(model)


def _tiny_qwen2() -> CausalLM:
    config = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(3)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers:  # visible biases, so that they are tested
                for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                   layer.self_attn.v_proj):
                    projection.bias.normal_(0.0, 0.5)
    finally:
        torch.random.set_rng_state(state)
    return CausalLM(model, None, "tiny-qwen2")


def test_a_second_family_with_attention_biases_runs_exactly() -> None:
    model = _tiny_qwen2()
    engine = IntegerForward(model)
    tokens = TOKENS[:20]
    tokens = [t % 256 for t in tokens]
    rows = _one_chunk(engine, tokens)[0]
    sequence = engine.new_sequence()
    steps = np.concatenate([engine.forward([(sequence, [t])])[0] for t in tokens])
    assert np.array_equal(steps, rows)
    with torch.inference_mode():
        logits = model.model(input_ids=torch.tensor([tokens])).logits[0].numpy()
    assert np.abs(rows / 2**LOGIT_FRAC - logits).max() < 0.02
    assert engine.weights.layers[0].qkv.bias is not None


@pytest.mark.real_model
def test_real_model_rows_are_invariant_and_close_to_float(real_model: CausalLM) -> None:
    engine = IntegerForward(real_model)
    tokens = real_model.encode_text(
        "The keeper lit the lamp at dusk and wrote the hour down in the log, as every keeper "
        "before him had done since the light was built.")
    with pinned_threads(2):
        reference, planes = _one_chunk(engine, tokens)
    rng = np.random.default_rng(1)
    with pinned_threads(1):
        sequence, mates = engine.new_sequence(), engine.new_batch(3)
        rows, start = [], 0
        while start < len(tokens):  # random chunks, beside random other sequences
            size = int(rng.integers(1, 6))
            calls = [(mate, [int(t) for t in rng.integers(0, 49152, rng.integers(0, 3))])
                     for mate in mates]
            slot = int(rng.integers(0, 4))
            calls.insert(slot, (sequence, tokens[start : start + size]))
            rows.append(engine.forward(calls)[slot])
            start += size
    assert np.array_equal(np.concatenate(rows), reference)
    assert torch.equal(sequence.state().planes, planes)
    assert np.array_equal(integer_tables(np.concatenate(rows))[0], integer_tables(reference)[0])
    with torch.inference_mode():
        logits = real_model.model(input_ids=torch.tensor([tokens])).logits[0].double().numpy()
    # Bound (measured on this sentence: mean KL 0.011 nats, largest 0.061, cross-entropy
    # +0.75%): mean KL(float || integer) below 0.03 nats per position, every position below
    # 0.15, next-token cross-entropy within 2% of the float model's.
    float_log_p = _log_softmax(logits)
    integer_log_p = _log_softmax(reference / 2**LOGIT_FRAC)
    divergence = (np.exp(float_log_p) * (float_log_p - integer_log_p)).sum(-1)
    assert divergence.mean() < 0.03 and divergence.max() < 0.15
    positions, targets = np.arange(len(tokens) - 1), np.array(tokens[1:])
    ratio = integer_log_p[positions, targets].mean() / float_log_p[positions, targets].mean()
    assert abs(ratio - 1) < 0.02


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(-1, keepdims=True)
    return np.asarray(shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)))

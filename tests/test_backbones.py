"""Every backbone family on its tiny random model: the row-invariant forward computes the model's
function, is row-invariant, recomputes KV exactly, and the other drivers run on it; architectures
without a backbone are refused with what they lack.

Float-noise bound: the row-invariant forward differs from transformers' forward only in the
attention core's reduction order, so its logits and KV stay within ``NOISE`` = 1e-5 of
transformers' (measured here: at most 2.3e-7 on every family, logits of magnitude ~0.7; leaving
out GPT-NeoX's partial rotation moves the logits by 3e-3 and a sequential residual in place of
its parallel one by 0.26, so the bound sees a wrong layer).
"""

from __future__ import annotations

import doctest
import importlib
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from backbone_cases import FAMILY_MODELS
from seqkv.errors import UnsupportedModelError
from seqkv.models import CausalLM
from seqkv.models.backbones import FAMILIES, backbone_for
from seqkv.models.rows import RECOMPUTE_CHUNK_ROWS, RowForward, row_forward
from seqkv.models.tiny import tiny_random_gpt_neox, tiny_random_llama, tiny_random_mistral
from seqkv.schedule import pinned_threads

NOISE = 1e-5
TOKENS = [int(t) for t in np.random.default_rng(0).integers(3, 512, 48)]


@pytest.fixture(scope="module", params=sorted(FAMILY_MODELS))
def model(request: pytest.FixtureRequest) -> CausalLM:
    return FAMILY_MODELS[request.param]()


@pytest.fixture(scope="module")
def engine(model: CausalLM) -> RowForward:
    return row_forward(model)


def _one_chunk(engine: RowForward, tokens: list[int]) -> tuple[np.ndarray, torch.Tensor]:
    sequence = engine.new_sequence()
    rows = engine.forward([(sequence, tokens)])[0]
    return rows, sequence.kv()


def test_every_registered_model_type_has_a_tiny_model() -> None:
    assert set(FAMILIES) == {FAMILY_MODELS[name]().config.model_type for name in FAMILY_MODELS}


def test_rows_match_transformers_within_float_noise(model: CausalLM, engine: RowForward) -> None:
    rows, kv = _one_chunk(engine, TOKENS)
    with torch.inference_mode():
        logits = model.model(input_ids=torch.tensor([TOKENS])).logits[0].numpy()  # [T, V]
    expected_kv = model.kv_tensor(model.prefill(TOKENS))
    assert np.abs(logits - rows).max() < NOISE
    assert (expected_kv - kv).abs().max() < NOISE
    assert kv.shape == (model.num_layers, 2, model.kv_heads, len(TOKENS), model.head_dim)


@given(cuts=st.lists(st.integers(1, 47), max_size=8, unique=True))
def test_any_chunking_gives_the_rows_of_one_chunk(engine: RowForward, cuts: list[int]) -> None:
    reference, kv = _one_chunk(engine, TOKENS)
    bounds = [0, *sorted(cuts), len(TOKENS)]
    sequence = engine.new_sequence()
    rows = np.concatenate([engine.forward([(sequence, TOKENS[a:b])])[0]
                           for a, b in itertools.pairwise(bounds)])
    assert np.array_equal(rows, reference)
    assert torch.equal(sequence.kv(), kv)


@given(others=st.lists(st.lists(st.integers(3, 511), min_size=0, max_size=6), max_size=5),
       slot=st.integers(0, 5), threads=st.sampled_from([1, 2]))
def test_rows_do_not_depend_on_the_other_sequences_in_a_forward(
    engine: RowForward, others: list[list[int]], slot: int, threads: int
) -> None:
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


def test_recompute_equals_stepping(engine: RowForward) -> None:
    sequence = engine.new_sequence()
    for token in TOKENS:
        engine.forward([(sequence, [token])])
    stepped = sequence.kv()
    before = engine.forwards
    assert torch.equal(engine.recompute(TOKENS), stepped)
    assert engine.forwards - before == 1
    assert torch.equal(engine.recompute(TOKENS[20:], stepped[:, :, :, :20]), stepped)


def test_recompute_runs_no_lm_head(engine: RowForward, monkeypatch: pytest.MonkeyPatch) -> None:
    """The KV is complete after the last block: a recompute never computes logits."""
    expected = engine.recompute(TOKENS)

    def no_head(hidden: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a recompute ran the LM head")

    monkeypatch.setattr(engine.backbone, "head", no_head)
    assert torch.equal(engine.recompute(TOKENS), expected)
    with pytest.raises(AssertionError, match="LM head"):
        engine.forward([(engine.new_sequence(), TOKENS[:3])])


def test_recompute_runs_in_chunks_of_the_encoders_rows(engine: RowForward) -> None:
    tokens = [3 + i % 500 for i in range(RECOMPUTE_CHUNK_ROWS + 5)]
    before = engine.forwards
    kv = engine.recompute(tokens)
    assert engine.forwards - before == 2
    assert torch.equal(kv, _one_chunk(engine, tokens)[1])


def test_first_layer_kv_is_each_id_alone_at_position_zero(model: CausalLM) -> None:
    ids = torch.arange(model.vocab_size)
    with torch.inference_mode():
        kv = backbone_for(model).first_layer_kv(ids)  # [V, 2, H, D]
        output = model.model(input_ids=ids[:, None], use_cache=True)  # V sequences of one id
    layer = output.cache.layers[0]
    direct = torch.stack((layer.keys[:, :, 0], layer.values[:, :, 0]), dim=1)  # [V, 2, H, D]
    assert kv.shape == (model.vocab_size, 2, model.kv_heads, model.head_dim)
    assert (kv - direct).abs().max() < NOISE


def test_a_model_type_without_a_backbone_is_refused() -> None:
    model = tiny_random_llama()
    model.config.model_type = "gpt2"
    with pytest.raises(UnsupportedModelError, match=r"'gpt2'.*lacks a file"):
        backbone_for(model)


def test_a_sliding_window_shorter_than_the_positions_is_refused() -> None:
    model = tiny_random_mistral()
    model.config.sliding_window = 16
    with pytest.raises(UnsupportedModelError, match=r"'mistral'.*sliding window of 16"):
        backbone_for(model)


def test_a_length_dependent_rotary_embedding_is_refused() -> None:
    model = tiny_random_llama()
    model.model.model.rotary_emb.rope_type = "dynamic"
    with pytest.raises(UnsupportedModelError, match=r"'llama'.*'dynamic' rotary"):
        backbone_for(model)


def test_a_missing_module_is_named() -> None:
    model = tiny_random_gpt_neox()
    del model.model.gpt_neox.layers[1].attention.query_key_value
    with pytest.raises(UnsupportedModelError, match=r"'gpt_neox'.*'attention\.query_key_value'"):
        backbone_for(model)


def test_the_engine_is_kept_with_its_model() -> None:
    model = tiny_random_llama(seed=1)
    assert row_forward(model) is row_forward(model)
    assert row_forward(model) is not row_forward(tiny_random_llama(seed=1))
    assert not [name for name in vars(model) if "row_forward" in name]


@pytest.mark.parametrize("name", ["seqkv.models.backbones.base",
                                  "seqkv.models.backbones.registry"])
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

"""A model's KV-collision classes (``seqkv.models.collisions``) against brute force, and
Theorem 1's exact gap in every coded trace."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backbone_cases import FAMILY_MODELS
from seqkv import compress, decompress
from seqkv.errors import UnsupportedModelError
from seqkv.levels.base import kv_gap_bits
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.models.collisions import (
    collision_classes,
    compute_collision_classes,
    first_layer_rows,
)

TOKENS = [(13 * i + 5) % 500 for i in range(40)]


def _tied(seed: int, groups: list[tuple[int, ...]]) -> CausalLM:
    """A tiny model whose ``groups`` of ids share their embedding rows."""
    model = tiny_random_llama(seed=seed)
    with torch.no_grad():
        embedding = model.model.get_input_embeddings().weight
        for group in groups:
            for token in group[1:]:
                embedding[token] = embedding[group[0]]
    return model


def test_the_classes_are_the_tied_embedding_rows() -> None:
    groups = [(7, 300), (9, 11, 400)]
    classes = compute_collision_classes(_tied(0, groups))
    assert classes.classes == tuple(sorted(groups)) and classes.candidates == 5


def test_a_model_without_collisions_has_no_classes(tiny_model: CausalLM) -> None:
    classes = collision_classes(tiny_model)
    rows = first_layer_rows(tiny_model)
    assert torch.unique(rows, dim=0).shape[0] == tiny_model.vocab_size  # brute force
    assert classes.classes == () and classes.candidates == 0


def test_equal_first_layer_rows_with_other_kv_deeper_are_split_by_the_forward(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ids whose first-layer rows collide but whose KV differs at a later layer (here: the
    first-layer rows are forced equal) are not one class: the forward splits them."""
    import seqkv.models.collisions as collisions

    model = tiny_random_llama(seed=1)
    rows = first_layer_rows(model).clone()
    rows[21] = rows[20]
    monkeypatch.setattr(collisions, "first_layer_rows", lambda m: rows)
    classes = compute_collision_classes(model)
    assert classes.candidates == 2 and classes.classes == ()


@pytest.mark.parametrize("family", sorted(FAMILY_MODELS))
def test_first_layer_rows_are_what_the_model_caches_for_each_id_alone(family: str) -> None:
    model = FAMILY_MODELS[family]()
    rows = first_layer_rows(model)  # [V, 2 * H * D]
    with torch.inference_mode():
        output = model.model(input_ids=torch.arange(model.vocab_size)[:, None], use_cache=True)
    layer = output.cache.layers[0]  # keys, values: [V, H, 1, D]
    direct = torch.cat((layer.keys[:, :, 0].flatten(1), layer.values[:, :, 0].flatten(1)), dim=1)
    assert rows.shape == (model.vocab_size, 2 * model.kv_heads * model.head_dim)
    assert (rows - direct).abs().max() < 1e-6


def test_a_model_without_a_backbone_is_refused() -> None:
    model = tiny_random_llama()
    model.config.model_type = "gpt2"
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        first_layer_rows(model)


def test_the_gap_is_the_within_class_entropy() -> None:
    log2p = np.log2(np.array([0.5, 0.25, 0.125, 0.125]))
    classes = (np.array([2, 3]),)
    # the class holds 1/4 of the mass split evenly: 0.25 * H(1/2, 1/2) = 0.25 bits
    assert kv_gap_bits(log2p, classes) == pytest.approx(0.25, abs=1e-15)
    assert kv_gap_bits(log2p, ()) == 0.0
    assert kv_gap_bits(np.array([0.0, -np.inf]), (np.array([0, 1]),)) == 0.0


@pytest.mark.parametrize("level", ["tokens", "portable"])
def test_tied_rows_give_a_gap_equal_to_the_within_class_entropy_at_every_position(
        level: str) -> None:
    """The mutant of the proof-check issue: a model with tied embedding rows. The gap is the
    within-class entropy of the coder's own distribution, position by position (reported, not
    a failure), identical in the encoder's and the decoder's traces."""
    groups = [(10, 11), (20, 21, 22)]
    model = _tied(4, groups)
    result = compress(model, TOKENS, level=level)
    trace = result.trace
    assert trace.kv_gap_bits.size == len(TOKENS) and np.all(trace.kv_gap_bits >= 0)
    assert trace.kv_gap_bits.max() > 0
    theorem1 = trace.theorem1()
    assert theorem1 is not None
    assert theorem1.gap_bits == pytest.approx(float(trace.kv_gap_bits.sum()))
    assert theorem1.kv_entropy_bits == pytest.approx(theorem1.token_entropy_bits
                                                     - theorem1.gap_bits)
    decoded = decompress(model, result.data)
    assert np.array_equal(decoded.trace.kv_gap_bits, trace.kv_gap_bits)


def test_the_gap_of_the_tied_model_matches_a_hand_computation() -> None:
    """At the tokens level the coder's distribution is the float model's: the gap at each
    position equals sum over groups of -sum p log2 (p / P(g)) from the model's own logits (the
    first token after the start token alone, the others after the tokens before them)."""
    groups = [(10, 11), (20, 21, 22)]
    model = _tied(4, groups)
    trace = compress(model, TOKENS[:12], level="tokens").trace
    with torch.inference_mode():
        first = model.model(input_ids=torch.tensor([[model.start_token_id]])).logits[0]
        rest = model.model(input_ids=torch.tensor([TOKENS[:11]])).logits[0]
    logits = torch.cat([first, rest]).double()
    log2p = (torch.log_softmax(logits, dim=-1) / np.log(2.0)).numpy()
    for position in range(12):
        p = np.exp2(log2p[position])
        within = sum(-float((p[list(g)] * np.log2(p[list(g)] / p[list(g)].sum())).sum())
                     for g in groups)
        assert trace.kv_gap_bits[position] == pytest.approx(within, rel=1e-4, abs=1e-9)


def test_model_free_levels_report_no_gap(tiny_model: CausalLM) -> None:
    trace = compress(tiny_model, TOKENS, level="ngram").trace
    assert trace.kv_gap_bits.size == 0 and trace.theorem1() is None

"""The predictors: the batched top-k forward against separate single-token forwards, exact
recompute against the token codec (on the tiny Llama and on every backbone family), and the
anchor-group references."""

from __future__ import annotations

import pytest
import torch

from backbone_cases import FAMILY_MODELS
from seqkv import compress, decompress
from seqkv.delta.predictors import (
    ExactRecompute,
    NoPrediction,
    PredictorContext,
    PreviousToken,
    TopKExpectation,
    candidate_mask,
    forward_candidates,
    recompute_kv,
)
from seqkv.kvcache import cache_from_tensor
from seqkv.models import CausalLM
from seqkv.schedule import pinned_threads

TOKENS = [5, 17, 17, 3, 9, 44, 300, 12]


@pytest.fixture(scope="module", params=sorted(FAMILY_MODELS))
def family_model(request: pytest.FixtureRequest) -> CausalLM:
    return FAMILY_MODELS[request.param]()


def test_candidate_mask_lets_each_row_see_the_prefix_and_itself() -> None:
    visible = candidate_mask(3, 4, torch.float32).eq(0)[0, 0]  # [4, 7]
    assert visible[:, :3].all()
    assert torch.equal(visible[:, 3:], torch.eye(4, dtype=torch.bool))


def test_batched_candidates_equal_separate_single_token_forwards(family_model: CausalLM) -> None:
    model = family_model
    prefix = model.kv_tensor(model.prefill(TOKENS))  # [L, 2, H, T, D]
    candidates = [7, 300, 2, 45, 45]
    written, logits = forward_candidates(model, prefix, candidates, keep_row=1)
    assert written.shape[3] == len(candidates)
    assert logits is not None
    for row, token in enumerate(candidates):
        cache = cache_from_tensor(prefix)
        with torch.inference_mode():
            out = model.model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
        single = model.kv_tensor(cache)[:, :, :, -1]  # [L, 2, H, D]
        assert torch.allclose(written[:, :, :, row], single, atol=1e-6)
        if row == 1:
            assert torch.allclose(logits, out.logits[0, -1], atol=1e-5)


def test_candidates_on_an_empty_prefix(tiny_model: CausalLM) -> None:
    written, logits = forward_candidates(tiny_model, None, [4, 9], keep_row=None)
    assert logits is None
    expected = tiny_model.kv_tensor(tiny_model.prefill([9]))[:, :, :, 0]
    assert torch.allclose(written[:, :, :, 1], expected, atol=1e-6)


def test_exact_recompute_is_the_token_codecs_kv_bit_for_bit(family_model: CausalLM) -> None:
    with pinned_threads():
        recomputed = recompute_kv(family_model, TOKENS)
    decoded = decompress(family_model, compress(family_model, TOKENS, level="tokens").data)
    assert torch.equal(recomputed, decoded.kv)


@pytest.mark.parametrize("predictor", [ExactRecompute(), TopKExpectation(k=3)],
                         ids=["exact", "topk"])
def test_model_predictors_run_on_every_family(family_model: CausalLM,
                                              predictor: ExactRecompute | TopKExpectation) -> None:
    model = family_model
    kv = model.kv_tensor(model.prefill(TOKENS))  # [L, 2, H, T, D]
    session = predictor.start(PredictorContext(model, tuple(TOKENS), len(TOKENS)))
    with pinned_threads():
        errors = []
        for position in range(len(TOKENS)):
            prediction = session.predict(position)
            errors.append(float((prediction - kv[:, :, :, position]).abs().max()))
            session.observe(position, kv[:, :, :, position])
    assert session.cost.calls == len(TOKENS) + (predictor.name == "topk_expectation")
    if predictor.name == "exact_recompute":
        assert max(errors) < 1e-5  # stepping vs one prefill: float noise only
    else:
        assert all(error > 0 for error in errors)  # an expectation, not the true token's KV


def test_previous_token_references(tiny_model: CausalLM) -> None:
    context = PredictorContext(tiny_model, None, 6)
    shape = (tiny_model.num_layers, 2, tiny_model.kv_heads, tiny_model.head_dim)
    values = [torch.full(shape, float(i + 1)) for i in range(6)]
    expected = {"previous": [0, 1, 2, 0, 4, 5], "anchor": [0, 1, 1, 0, 4, 4]}
    for reference, want in expected.items():
        session = PreviousToken(group_size=3, reference=reference).start(  # type: ignore[arg-type]
            context)
        got = []
        for i, value in enumerate(values):
            got.append(int(session.predict(i)[0, 0, 0, 0]))
            session.observe(i, value)
        assert got == want
        assert session.cost.calls == 0


def test_no_prediction_is_zero_and_free(tiny_model: CausalLM) -> None:
    session = NoPrediction().start(PredictorContext(tiny_model, None, 1))
    assert not session.predict(0).any()
    session.observe(0, torch.ones(1))
    assert session.cost.calls == session.cost.rows == 0

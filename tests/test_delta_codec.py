"""The delta codec on the tiny model: round trip and error bound of every predictor x quantizer,
bit accounting, and one pytest.raises per precondition."""

from __future__ import annotations

import math

import pytest
import torch

from seqkv.delta import (
    AllocationMode,
    DeltaConfig,
    ExactRecompute,
    NoPrediction,
    Predictor,
    PreviousToken,
    TopKExpectation,
    decode_delta,
    encode_delta,
    store_tokens,
    surprisal_bits,
)
from seqkv.delta.bit_allocation import WIDTH_FIELD_BITS
from seqkv.errors import DeltaConfigError, InvalidKVError, InvalidTokensError
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.quantizers import QuantizerName

TOKENS = [5, 17, 17, 3, 9, 44, 300, 12, 12, 12, 7, 101, 2, 64, 65, 66, 400, 8, 9, 10]
PREDICTORS: tuple[Predictor, ...] = (
    NoPrediction(), PreviousToken(group_size=4), PreviousToken(group_size=4, reference="anchor"),
    TopKExpectation(k=6), ExactRecompute(),
)
QUANTIZERS: tuple[tuple[QuantizerName, int], ...] = (
    ("turboquant_mse", 2), ("turboquant_prod", 3), ("kivi", 2), ("int8", 8), ("fp8", 8),
)
# TurboQuant_mse's upper bound on E||x - xhat||^2 / ||x||^2 (arXiv 2504.19874): sqrt(3) pi/2 4^-b.
_TURBOQUANT_BOUND = math.sqrt(3) * math.pi / 2


@pytest.fixture(scope="module")
def kv(tiny_model: CausalLM) -> torch.Tensor:
    return tiny_model.kv_tensor(tiny_model.prefill(TOKENS))


def _per_vector(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])  # [N, D]


def _bound_holds(name: QuantizerName, bits: int, residual: torch.Tensor,
                 error: torch.Tensor, slack: torch.Tensor) -> None:
    """Each quantizer's guarantee on ``error`` (``KV - decoded``) for the input ``residual``."""
    r = _per_vector(residual)  # [N, D]: vectors along head_dim
    e = _per_vector(error)
    s = _per_vector(slack)
    # Scales are stored in fp16, rounded up: one fp16 spacing at most, which is relative
    # (2^-10) for normal values and 2^-24 in the subnormal range.
    fp16_up, fp16_tiny = 1 + 2.0**-10, 2.0**-24
    if name == "int8":
        step = r.abs().amax(dim=-1, keepdim=True) / 127 * fp16_up + fp16_tiny
        assert (e.abs() <= step / 2 + s).all()
    elif name == "fp8":
        scale = r.abs().amax(dim=-1, keepdim=True) / 448 * fp16_up + fp16_tiny
        assert (e.abs() <= torch.maximum(r.abs() / 16, scale / 1024) + s).all()
    elif name == "kivi":
        groups = r.reshape(r.shape[0], -1, min(32, r.shape[1]))  # [N, G, 32]: value layout
        low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        # The fp16 zero-point is rounded down: at most one fp16 spacing below the minimum.
        spread = high - low + (low.abs() * 2.0**-10).clamp_min(fp16_tiny)
        step = spread / ((1 << bits) - 1) * fp16_up + fp16_tiny
        assert (e.reshape(groups.shape).abs() <= step / 2 + s.reshape(groups.shape)).all()
    else:
        # TurboQuant: no per-element bound; the mean relative squared error is bounded. Prod
        # spends one bit on QJL, whose unbiased estimate costs up to pi/2 of the MSE stage's.
        norms = r.square().sum(-1)
        used = norms > 1e-20
        ratio = (e.square().sum(-1)[used] / norms[used]).mean()
        limit = _TURBOQUANT_BOUND * 4.0**-bits
        if name == "turboquant_prod":
            limit = math.pi / 2 * (_TURBOQUANT_BOUND * 4.0 ** -(bits - 1) + 1.0 / r.shape[1])
        assert ratio <= limit


@pytest.mark.parametrize("predictor", PREDICTORS, ids=lambda p: p.label)
@pytest.mark.parametrize(("quantizer", "bits"), QUANTIZERS, ids=lambda q: str(q))
def test_round_trip_and_error_bound(tiny_model: CausalLM, kv: torch.Tensor,
                                    predictor: Predictor, quantizer: QuantizerName,
                                    bits: int) -> None:
    config = DeltaConfig(predictor, quantizer, bits)
    encoded = encode_delta(tiny_model, TOKENS, kv, config)
    decoded = decode_delta(tiny_model, encoded.code)
    assert torch.equal(decoded.kv, encoded.decoded)
    if predictor.needs_tokens:
        assert decoded.tokens == TOKENS
    assert torch.equal(encoded.residual, kv - encoded.prediction)
    error = kv - encoded.decoded
    # One float32 rounding in prediction + dequantized residual, one in KV - prediction.
    slack = 4 * torch.finfo(torch.float32).eps * (kv.abs() + encoded.prediction.abs()) + 1e-30
    _bound_holds(quantizer, bits, encoded.residual, error, slack)


def test_exact_recompute_residual_is_numerical_noise(tiny_model: CausalLM,
                                                     kv: torch.Tensor) -> None:
    encoded = encode_delta(tiny_model, TOKENS, kv, DeltaConfig(ExactRecompute(), "int8", 8))
    assert encoded.residual.abs().max() < 1e-5
    assert encoded.residual_energy < 1e-10


def test_top_k_with_k_1_predicts_the_argmax_continuation(tiny_model: CausalLM,
                                                         kv: torch.Tensor) -> None:
    # k = 1: the prediction is exactly the KV of the most likely token given the decoded prefix;
    # with int8 at position 0 the prefix is empty, so compare against a plain forward.
    encoded = encode_delta(tiny_model, TOKENS[:1], kv[:, :, :, :1],
                           DeltaConfig(TopKExpectation(k=1), "int8", 8))
    from seqkv.delta.predictors.topk_expectation import start_distribution

    probs = start_distribution(tiny_model)
    assert probs is not None
    best = int(probs.argmax())
    expected = tiny_model.kv_tensor(tiny_model.prefill([best]))[:, :, :, 0]
    assert torch.allclose(encoded.prediction[:, :, :, 0], expected, atol=1e-6)


@pytest.mark.parametrize("predictor", PREDICTORS, ids=lambda p: p.label)
def test_bits_are_accounted_part_by_part(tiny_model: CausalLM, kv: torch.Tensor,
                                         predictor: Predictor) -> None:
    store = store_tokens(tiny_model, TOKENS)
    code = encode_delta(tiny_model, TOKENS, kv, DeltaConfig(predictor, "turboquant_mse", 3),
                        token_store=store).code
    parts = code.breakdown
    layers, _, heads, tokens, _ = code.shape
    assert parts.side == 16 * layers * 2 * heads * tokens  # one fp16 norm per vector
    assert parts.widths == WIDTH_FIELD_BITS * tokens
    assert parts.tokens == (store.code_bits if predictor.needs_tokens else 0)
    assert parts.payload == code.symbols.payload_bits and parts.tables == code.symbols.table_bits
    assert code.num_bits == parts.payload + parts.tables + parts.side + parts.widths + parts.tokens
    assert code.bits_per_token == code.num_bits / len(TOKENS)
    assert code.packed_code_bits == 3 * kv.numel()


def test_surprisal_allocations_round_trip_and_store_their_widths(tiny_model: CausalLM,
                                                                 kv: torch.Tensor) -> None:
    surprisal = surprisal_bits(tiny_model, TOKENS)
    assert surprisal.bits.shape == (len(TOKENS),) and (surprisal.bits >= 0).all()
    for mode in (AllocationMode.SURPRISAL, AllocationMode.SURPRISAL_BUDGET):
        config = DeltaConfig(PreviousToken(group_size=4), "turboquant_mse", 3, mode)
        encoded = encode_delta(tiny_model, TOKENS, kv, config, surprisal=surprisal)
        assert torch.equal(decode_delta(tiny_model, encoded.code).kv, encoded.decoded)
        assert encoded.cost == surprisal.cost
        if mode is AllocationMode.SURPRISAL_BUDGET:
            assert sum(encoded.code.widths) == 3 * len(TOKENS)


def test_costs_count_the_token_codec_and_the_predictor(tiny_model: CausalLM,
                                                       kv: torch.Tensor) -> None:
    encoded = encode_delta(tiny_model, TOKENS, kv, DeltaConfig(ExactRecompute(), "int8", 8))
    count = len(TOKENS)
    # Token codec: start token + one step per token; exact recompute: one step per token.
    assert encoded.cost.calls == (count + 1) + count
    decoded = decode_delta(tiny_model, encoded.code)
    assert decoded.cost.calls == (count + 1) + count
    free = encode_delta(tiny_model, TOKENS, kv, DeltaConfig(NoPrediction(), "int8", 8))
    assert free.cost.calls == 0 and free.code.tokens is None


def test_decoding_the_stored_tokens_rebuilds_no_kv(tiny_model: CausalLM, kv: torch.Tensor,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost above counts the token codec's steps only: the tokens are decoded without the
    KV prefill a full decode adds (the delta code rebuilds the KV itself)."""
    import seqkv.codec as codec

    encoded = encode_delta(tiny_model, TOKENS, kv, DeltaConfig(ExactRecompute(), "int8", 8))

    def no_kv(*args: object, **kwargs: object) -> None:
        raise AssertionError("the token decode rebuilt the KV")

    monkeypatch.setattr(codec, "_finish", no_kv)
    assert torch.equal(decode_delta(tiny_model, encoded.code).kv, encoded.decoded)


def test_kv_of_another_shape_is_refused(tiny_model: CausalLM, kv: torch.Tensor) -> None:
    with pytest.raises(InvalidKVError, match="shape"):
        encode_delta(tiny_model, TOKENS[:-1], kv, DeltaConfig(NoPrediction()))


def test_non_finite_kv_is_refused(tiny_model: CausalLM, kv: torch.Tensor) -> None:
    bad = kv.clone()
    bad[0, 0, 0, 0, 0] = math.nan
    with pytest.raises(InvalidKVError, match="NaN"):
        encode_delta(tiny_model, TOKENS, bad, DeltaConfig(NoPrediction()))


def test_tokens_outside_the_vocabulary_are_refused(tiny_model: CausalLM,
                                                   kv: torch.Tensor) -> None:
    with pytest.raises(InvalidTokensError, match="vocabulary"):
        encode_delta(tiny_model, [*TOKENS[:-1], 10**6], kv, DeltaConfig(NoPrediction()))


def test_int8_at_another_budget_is_refused() -> None:
    with pytest.raises(DeltaConfigError, match="supports budgets"):
        DeltaConfig(NoPrediction(), "int8", 3)


def test_int8_with_a_surprisal_allocation_is_refused() -> None:
    with pytest.raises(DeltaConfigError, match="one width only"):
        DeltaConfig(NoPrediction(), "int8", 8, AllocationMode.SURPRISAL)


def test_top_k_needs_a_positive_k() -> None:
    with pytest.raises(DeltaConfigError, match="k must be positive"):
        TopKExpectation(k=0)


def test_anchor_groups_need_a_positive_size() -> None:
    with pytest.raises(DeltaConfigError, match="group_size"):
        PreviousToken(group_size=0)


def test_surprisal_of_another_length_is_refused(tiny_model: CausalLM, kv: torch.Tensor) -> None:
    surprisal = surprisal_bits(tiny_model, TOKENS[:-1])
    with pytest.raises(DeltaConfigError, match="surprisal has shape"):
        encode_delta(tiny_model, TOKENS, kv,
                     DeltaConfig(NoPrediction(), allocation=AllocationMode.SURPRISAL),
                     surprisal=surprisal)


def test_a_token_store_of_other_tokens_is_refused(tiny_model: CausalLM,
                                                  kv: torch.Tensor) -> None:
    store = store_tokens(tiny_model, TOKENS[:-1])
    with pytest.raises(InvalidTokensError, match="token store"):
        encode_delta(tiny_model, TOKENS, kv, DeltaConfig(ExactRecompute(), "int8", 8),
                     token_store=store)


def test_decoding_with_another_model_geometry_is_refused(tiny_model: CausalLM,
                                                         kv: torch.Tensor) -> None:
    code = encode_delta(tiny_model, TOKENS, kv, DeltaConfig(NoPrediction(), "int8", 8)).code
    other = tiny_random_llama(seed=1, vocab_size=256)
    other_code = type(code)(code.config, (3, 2, 2, len(TOKENS), 16), code.widths, code.sides,
                            code.symbols, code.tokens, code.packed_code_bits)
    with pytest.raises(InvalidKVError, match="cannot have produced"):
        decode_delta(other, other_code)


def test_decoding_with_tokens_of_another_length_is_refused(tiny_model: CausalLM,
                                                           kv: torch.Tensor) -> None:
    code = encode_delta(tiny_model, TOKENS, kv, DeltaConfig(ExactRecompute(), "int8", 8)).code
    with pytest.raises(InvalidTokensError, match="positions"):
        decode_delta(tiny_model, code, tokens=TOKENS[:-1])

"""The codec on the tiny random Llama: round trips, KV tolerance, and one test per bad input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import DynamicCache

from seqkv import bounds, compress, decompress
from seqkv.bounds import reference_surprisal
from seqkv.descriptions import Descriptions
from seqkv.digests import profile_digest
from seqkv.errors import (
    DecodeVerificationError,
    EmptyInputError,
    EnvironmentMismatchError,
    InvalidKVError,
    InvalidTokensError,
    ModelMismatchError,
)
from seqkv.formats.skv import read_skv, write_skv
from seqkv.kvcache import cache_from_tensor, tensor_from_cache
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.skv import CompressResult

VOCAB = 512


@given(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40))
def test_token_round_trip(tiny_model: CausalLM, tokens: list[int]) -> None:
    result = compress(tiny_model, tokens, level="tokens")
    decoded = decompress(tiny_model, result.data)
    assert decoded.tokens == tokens
    assert decoded.stats.verified
    assert result.stats.code_bits <= result.stats.cross_entropy_bits + 2 + 2e-5 * len(tokens)
    # The decoder sees the same distributions as the encoder, position by position.
    assert np.array_equal(decoded.trace.surprisal_bits, result.trace.surprisal_bits)
    assert np.array_equal(decoded.trace.entropy_bits, result.trace.entropy_bits)
    assert result.trace.surprisal_bits.sum() == pytest.approx(result.stats.cross_entropy_bits)
    assert np.all((result.trace.entropy_bits >= 0) & (result.trace.entropy_bits <= np.log2(VOCAB)))


@given(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
    st.sampled_from([0.0, 1e-7, 1e-5, 1e-3]),
    st.integers(0, 2**31),
)
def test_kv_round_trip_within_tolerance(
    tiny_model: CausalLM, tokens: list[int], tolerance: float, seed: int
) -> None:
    original = tensor_from_cache(tiny_model.prefill(tokens))
    noise = torch.randn(original.shape, generator=torch.Generator().manual_seed(seed))
    given_kv = original + 1e-4 * noise  # a cache from some other run of the same tokens
    result = compress(tiny_model, tokens, kv=given_kv, tolerance=tolerance)
    decoded = decompress(tiny_model, result.data)
    error = (decoded.kv - given_kv).abs().max().item()
    assert error <= tolerance
    assert result.stats.max_abs_kv_error == error
    recomputed = decompress(tiny_model, compress(tiny_model, tokens).data).kv  # no residual
    assert decoded.stats.max_abs_residual == (decoded.kv - recomputed).abs().max().item()
    if tolerance == 0.0:
        assert torch.equal(decoded.kv, given_kv)


def test_decoded_cache_is_a_dynamic_cache_with_the_kv(tiny_model: CausalLM) -> None:
    tokens = [4, 8, 15, 16, 23, 42]
    decoded = decompress(tiny_model, compress(tiny_model, tokens).data)
    assert isinstance(decoded.cache, DynamicCache)
    assert decoded.cache.get_seq_length() == len(tokens)
    assert torch.equal(tensor_from_cache(decoded.cache), decoded.kv)


def test_kv_conversion_round_trip(tiny_model: CausalLM) -> None:
    kv = tensor_from_cache(tiny_model.prefill([1, 2, 3]))  # [L, 2, H, T, D]
    assert kv.shape == (2, 2, 2, 3, 16)
    assert torch.equal(tensor_from_cache(cache_from_tensor(kv)), kv)


def test_first_token_is_coded_under_the_start_context(tiny_model: CausalLM) -> None:
    result = compress(tiny_model, [7], level="tokens")
    after_bos = reference_surprisal(tiny_model, [[7]], tiny_model.config.bos_token_id)
    assert result.trace.surprisal_bits[0] == pytest.approx(after_bos[0], abs=1e-4)
    assert result.stats.code_bits <= result.stats.cross_entropy_bits + 2


@pytest.mark.parametrize("rows", [1, 3, 256])
def test_reference_surprisal_in_row_chunks_is_the_whole_matrix_pick(
        tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """Chunked float64 log-softmax (no [T, V] float64 matrix) picks the same bits as one over
    the whole matrix, for a segment after a prefix and for segments of their own."""
    monkeypatch.setattr("seqkv.bounds._SURPRISAL_ROWS", rows)
    tokens = [(7 * i + 3) % VOCAB for i in range(23)]

    def whole(ids: list[int]) -> np.ndarray:
        with torch.inference_mode():
            logits = tiny_model.model(input_ids=torch.tensor([ids])).logits[0]
        return (torch.log_softmax(logits.double(), dim=-1) / np.log(2.0)).numpy()

    after_prefix = reference_surprisal(tiny_model, [tokens[9:]], None, prefix=tokens[:9])
    matrix = whole(tokens)
    assert np.array_equal(after_prefix, -matrix[np.arange(8, 22), tokens[9:]])
    own = reference_surprisal(tiny_model, [tokens[:9], tokens[9:]], 1)
    start = whole([1])[0]
    expected = []
    for segment in (tokens[:9], tokens[9:]):
        rows = whole(segment)
        expected += [-start[segment[0]], *(-rows[np.arange(len(segment) - 1), segment[1:]])]
    assert np.array_equal(own, np.array(expected))


def _whole_surprisal(model: CausalLM, ids: list[int]) -> np.ndarray:
    """-log2 p(ids[i + 1]) from the network's whole [T, V] logits."""
    with torch.inference_mode():
        logits = model.model(input_ids=torch.tensor([ids])).logits[0]
    log2p = (torch.log_softmax(logits.double(), dim=-1) / np.log(2.0)).numpy()
    return -log2p[np.arange(len(ids) - 1), ids[1:]]


def test_the_output_layer_runs_on_blocks_of_rows_that_cover_the_whole(
        tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of at least ``_HEAD_ROWS`` rows, contiguous, the remainder in the last: no [T, V]
    matrix, and the network's logits (to float32 rounding: a block is another product's)."""
    monkeypatch.setattr("seqkv.bounds._HEAD_ROWS", 4)
    ids = [(5 * i + 1) % VOCAB for i in range(23)]
    with torch.inference_mode():
        logits = tiny_model.model(input_ids=torch.tensor([ids])).logits[0]
        blocks = list(bounds.logit_blocks(tiny_model.model, ids, slice(2, 22)))
    assert [(offset, len(block)) for offset, block in blocks] == [
        (0, 4), (4, 4), (8, 4), (12, 4), (16, 4)]
    assert torch.allclose(torch.cat([b for _, b in blocks]), logits[2:22], atol=1e-5)
    with torch.inference_mode():  # the remainder (3 rows) joins the last block
        blocks = list(bounds.logit_blocks(tiny_model.model, ids, slice(0, 19)))
    assert [(offset, len(block)) for offset, block in blocks] == [(0, 4), (4, 4), (8, 4),
                                                                  (12, 7)]
    assert np.allclose(reference_surprisal(tiny_model, [ids], None)[1:],
                       _whole_surprisal(tiny_model, ids), atol=1e-4)
    with torch.inference_mode():  # fewer rows than a block: cut from a window of 4
        blocks = list(bounds.logit_blocks(tiny_model.model, ids, slice(20, 22)))
        assert [(offset, len(block)) for offset, block in blocks] == [(0, 2)]
        assert torch.allclose(blocks[0][1], logits[20:22], atol=1e-5)
        # a cache is filled once, from empty; one that holds positions is refused
        cache = DynamicCache()
        list(bounds.logit_blocks(tiny_model.model, ids, slice(0, 23), cache))
        assert cache.get_seq_length() == len(ids)
        with pytest.raises(ValueError, match="empty cache"):
            list(bounds.logit_blocks(tiny_model.model, ids, slice(0, 23), cache))


def test_a_network_whose_logits_are_not_its_head_of_the_last_state_runs_whole(
        tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """An architecture that scales its logits after the output layer: the blocks would miss
    the scale, so the reference falls back to the network's own [T, V] logits."""
    monkeypatch.setattr("seqkv.bounds._HEAD_ROWS", 4)
    ids = [(3 * i + 2) % VOCAB for i in range(20)]

    def scaled(module: torch.nn.Module, args: object, output: object) -> object:
        output.logits = output.logits * 2.0  # type: ignore[attr-defined]
        return output

    hook = tiny_model.model.register_forward_hook(scaled)
    try:
        found = reference_surprisal(tiny_model, [ids], None)[1:]
        expected = _whole_surprisal(tiny_model, ids)
    finally:
        hook.remove()
    assert np.array_equal(found, expected)


@pytest.mark.real_model
def test_the_reference_on_blocks_is_the_whole_matrix_reference_on_smollm2(
        real_model: CausalLM) -> None:
    """600 tokens: two blocks of the output layer (256 and 343 rows) against the network's own
    [600, V] logits. Equal bits here (torch 2.13 CPU); another CPU's product may round
    otherwise, so the test allows float32 rounding."""
    from seqkv.bench.texts import shipped_text

    ids = real_model.encode_text(shipped_text("legal"))[:600]
    found = reference_surprisal(real_model, [ids], None)[1:]
    assert np.allclose(found, _whole_surprisal(real_model, ids), rtol=0, atol=1e-4)


def test_empty_tokens(tiny_model: CausalLM) -> None:
    with pytest.raises(EmptyInputError, match="no tokens"):
        compress(tiny_model, [])


def test_tokens_outside_the_vocabulary(tiny_model: CausalLM) -> None:
    with pytest.raises(InvalidTokensError, match="vocabulary of 512"):
        compress(tiny_model, [1, 2, VOCAB])


def test_kv_of_other_tokens(tiny_model: CausalLM) -> None:
    with pytest.raises(InvalidKVError, match="other tokens"):
        compress(tiny_model, [1, 2, 3], kv=tiny_model.prefill([1, 2]))


def test_kv_with_a_batch_of_two(tiny_model: CausalLM) -> None:
    kv = tensor_from_cache(tiny_model.prefill([1, 2]))
    cache = DynamicCache()
    for layer in range(kv.shape[0]):
        cache.update(kv[layer, 0].expand(2, -1, -1, -1), kv[layer, 1].expand(2, -1, -1, -1), layer)
    with pytest.raises(InvalidKVError, match="batch size 2"):
        compress(tiny_model, [1, 2], kv=cache)


def test_another_model_is_refused_by_name_or_by_digest(tiny_model: CausalLM,
                                                       tmp_path: Path) -> None:
    result = compress(tiny_model, [1, 2, 3])
    other = tiny_random_llama(seed=1)
    with pytest.raises(ModelMismatchError, match=r"another model \(digest"):
        decompress(other, result.data)
    descriptions = Descriptions(tmp_path)
    descriptions.remember(result.model_identity, result.profile)
    with pytest.raises(ModelMismatchError, match="coded with model 'tiny-random-llama-seed0'"):
        decompress(other, result.data, descriptions=descriptions)


def _with_profile(result: CompressResult, descriptions: Descriptions,
                  **changes: str | int) -> bytes:
    """The file as if coded under another profile, whose description the registry holds."""
    profile = dataclasses.replace(result.profile, **changes)  # type: ignore[arg-type]
    descriptions.remember(profile=profile)
    session = read_skv(result.data).session
    return write_skv(dataclasses.replace(session, profile_digest=profile_digest(profile))).data


def test_other_device_class_is_refused(tiny_model: CausalLM, tmp_path: Path) -> None:
    descriptions = Descriptions(tmp_path)
    data = _with_profile(compress(tiny_model, [1, 2, 3], level="tokens"), descriptions,
                         device_class="cuda:NVIDIA H200")
    with pytest.raises(EnvironmentMismatchError, match="device_class"):
        decompress(tiny_model, data, allow_environment_mismatch=True, descriptions=descriptions)


def test_other_library_version_is_refused_unless_allowed(tiny_model: CausalLM,
                                                         tmp_path: Path) -> None:
    descriptions = Descriptions(tmp_path)
    data = _with_profile(compress(tiny_model, [1, 2, 3], level="tokens"), descriptions,
                         torch_version="0.0.1")
    with pytest.raises(EnvironmentMismatchError, match="torch_version"):
        decompress(tiny_model, data, descriptions=descriptions)
    with pytest.raises(EnvironmentMismatchError, match=r"profile \(digest"):
        decompress(tiny_model, data)  # the description is not at hand: named by digest
    assert decompress(tiny_model, data, allow_environment_mismatch=True).tokens == [1, 2, 3]


def test_desynchronised_probabilities_fail_loudly(tiny_model: CausalLM) -> None:
    """A decoder whose probabilities differ in the last bits must not return wrong tokens."""
    tokens = list(np.random.default_rng(3).integers(0, VOCAB, 60))
    data = compress(tiny_model, tokens).data
    perturbed = tiny_random_llama(seed=0)
    with torch.no_grad():
        perturbed.model.lm_head.weight.mul_(1 + 1e-6)
    # Same identity on purpose (as a different CPU kernel would give): only the checksum can tell.
    perturbed.__dict__["identity"] = tiny_model.identity
    with pytest.raises(DecodeVerificationError, match="checksum"):
        decompress(perturbed, data)


def test_damaged_token_code_fails_loudly(tiny_model: CausalLM) -> None:
    session = read_skv(compress(tiny_model, list(range(10, 50))).data).session
    code = session.token_code
    flipped = bytes([code.data[0] ^ 0x10]) + code.data[1:]
    damaged = dataclasses.replace(session, token_code=dataclasses.replace(code, data=flipped))
    with pytest.raises(DecodeVerificationError, match="tokens"):
        decompress(tiny_model, write_skv(damaged).data)

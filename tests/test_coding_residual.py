"""The KV residual coder: tolerance bound, bit-exact mode, escapes, and zero-cost zero groups."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv.coding.residual import (
    ALPHABET_LIMIT,
    ResidualMode,
    _coded_residual,
    decode_residual,
    encode_residual,
)
from seqkv.errors import CorruptFileError, InvalidKVError

SHAPE = (3, 2, 2, 5, 8)  # [L, 2, H, T, D]


def _pair(seed: int, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    recomputed = torch.randn(SHAPE, generator=generator) * 4
    target = recomputed + torch.randn(SHAPE, generator=generator) * noise
    return target, recomputed


@given(st.integers(0, 2**31), st.sampled_from([1e-6, 1e-5, 1e-3]),
       st.sampled_from([1e-5, 1e-4, 1e-2, 1.0]))
def test_quantized_round_trip_within_tolerance(seed: int, noise: float, tolerance: float) -> None:
    target, recomputed = _pair(seed, noise)
    code, rebuilt = encode_residual(target, recomputed, tolerance)
    assert code.mode is ResidualMode.QUANTIZED
    decoded = decode_residual(code, recomputed)
    assert torch.equal(decoded, rebuilt)
    assert (decoded - target).abs().max().item() <= tolerance


@given(st.integers(0, 2**31), st.sampled_from([0.0, 1e-6, 1e-3, 10.0]))
def test_bit_exact_mode_reproduces_every_bit(seed: int, noise: float) -> None:
    target, recomputed = _pair(seed, noise)
    target[0, 0, 0, 0, :3] = torch.tensor([-0.0, 0.0, 1e-40])  # signed zero and a subnormal
    code, _ = encode_residual(target, recomputed, 0.0)
    assert code.mode is ResidualMode.BIT_EXACT
    decoded = decode_residual(code, recomputed)
    assert torch.equal(decoded.view(torch.int32), target.view(torch.int32))


def test_identical_tensors_cost_one_flag_bit_per_group() -> None:
    target, _ = _pair(0, 0.0)
    code, _ = encode_residual(target, target.clone(), 1e-4)
    assert code.words == b"" and code.escapes == b""
    assert code.num_bits == SHAPE[0] * SHAPE[1]


@pytest.mark.parametrize("tolerance", [0.0, 1e-4])
def test_identical_tensors_take_the_short_way_to_the_same_code_and_tensor(
        tolerance: float) -> None:
    """encode_residual skips the symbols of a bit-identical pair; its code and rebuilt tensor
    are the full coder's, bit for bit, negative zeros included (the quantized rebuild turns
    them positive, and the decoder does the same)."""
    recomputed = _pair(4, 0.0)[1]
    recomputed[0, 0, 0, 0, :3] = torch.tensor([-0.0, 0.0, -0.0])
    target = recomputed.clone()
    mode = ResidualMode.BIT_EXACT if tolerance == 0 else ResidualMode.QUANTIZED
    code, rebuilt = encode_residual(target, recomputed, tolerance)
    full_code, full_rebuilt = _coded_residual(target, recomputed, mode, tolerance)
    assert code == full_code
    assert torch.equal(rebuilt.view(torch.int32), full_rebuilt.view(torch.int32))
    assert torch.equal(decode_residual(code, recomputed).view(torch.int32),
                       rebuilt.view(torch.int32))


@pytest.mark.parametrize("tolerance", [0.0, 1e-4])
def test_a_zero_code_decodes_the_short_way_and_refuses_words_appended(tolerance: float) -> None:
    """A code of all-0 symbols rebuilds without its symbol planes, to the encoder's bits (the
    test above), into a tensor of its own; with words appended it is not canonical (mutant:
    the short way without the words check -> decodes)."""
    recomputed = _pair(5, 0.0)[1]
    code, rebuilt = encode_residual(recomputed.clone(), recomputed, tolerance)
    decoded = decode_residual(code, recomputed, canonical=True)
    assert torch.equal(decoded.view(torch.int32), rebuilt.view(torch.int32))
    decoded += 1.0
    assert not torch.equal(decoded, recomputed)
    forged = dataclasses.replace(code, words=code.words + b"\x01\x00\x00\x00")
    with pytest.raises(CorruptFileError, match="words appended"):
        decode_residual(forged, recomputed, canonical=True)


def test_far_outliers_are_escaped_exactly() -> None:
    target, recomputed = _pair(1, 1e-5)
    target[1, 1, 0, 2, 3] = recomputed[1, 1, 0, 2, 3] + 5e3
    code, _ = encode_residual(target, recomputed, 1e-4)
    assert code.num_escapes >= 1
    decoded = decode_residual(code, recomputed)
    assert decoded[1, 1, 0, 2, 3] == target[1, 1, 0, 2, 3]
    assert (decoded - target).abs().max().item() <= 1e-4
    assert 2 * 1e-4 * ALPHABET_LIMIT < 5e3


def test_rejects_shape_mismatch() -> None:
    target, recomputed = _pair(0, 1e-5)
    with pytest.raises(InvalidKVError, match="recomputing"):
        encode_residual(target[:, :, :, :4], recomputed, 1e-4)


def test_rejects_negative_tolerance() -> None:
    target, recomputed = _pair(0, 1e-5)
    with pytest.raises(ValueError, match="tolerance"):
        encode_residual(target, recomputed, -1.0)


def test_rejects_non_finite_kv() -> None:
    target, recomputed = _pair(0, 1e-5)
    target[0, 0, 0, 0, 0] = float("nan")
    with pytest.raises(InvalidKVError, match="NaN"):
        encode_residual(target, recomputed, 1e-4)

"""Exact stored bit counts (payload + side information) for every quantizer, and the factory."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from seqkv.quantizers import (
    FP8E4M3,
    KIVI,
    Int8Absmax,
    QuantizedTensor,
    Quantizer,
    QuantizerName,
    TurboQuantMSE,
    TurboQuantProd,
    make_quantizer,
)

SHAPES = [(2, 3, 300, 64), (1, 7, 64), (5, 64), (1, 1, 129, 64)]


def _bytes_bits(count: int, bits: int) -> int:
    return 8 * math.ceil(count * bits / 8)


def _x(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).half()


def _expected_kivi(shape: tuple[int, ...], bits: int, role: str) -> int:
    lead, tokens, dim = math.prod(shape[:-2]), shape[-2], shape[-1]
    dense = min(tokens, 128)
    quant = tokens - dense
    groups = dim * math.ceil(quant / 32) if role == "key" else quant * math.ceil(dim / 32)
    payload = _bytes_bits(lead * quant * dim, bits)
    return payload + lead * (16 * 2 * groups + 16 * dense * dim)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits", [1, 3, 4])
def test_turboquant_bit_counts(shape: tuple[int, ...], bits: int) -> None:
    n_vec, n = math.prod(shape[:-1]), math.prod(shape)
    mse = TurboQuantMSE(64, bits)
    q = mse.quantize(_x(shape))
    assert q.num_bits == _bytes_bits(n, bits) + 16 * n_vec == mse.num_bits_for(shape)
    assert q.num_valid_bits == n * bits + 16 * n_vec
    assert q.side_bits == 16 * n_vec

    prod = TurboQuantProd(64, bits)
    qp = prod.quantize(_x(shape))
    mse_stage = _bytes_bits(n, bits - 1) if bits > 1 else 0
    assert qp.num_bits == mse_stage + _bytes_bits(n, 1) + 32 * n_vec == prod.num_bits_for(shape)
    assert qp.num_valid_bits == n * bits + 32 * n_vec
    assert (qp.codes is None) == (bits == 1)


@pytest.mark.parametrize("shape", [s for s in SHAPES if len(s) >= 3])
@pytest.mark.parametrize("role", ["key", "value"])
@pytest.mark.parametrize("bits", [2, 3])
def test_kivi_bit_counts(shape: tuple[int, ...], role: str, bits: int) -> None:
    kq = KIVI(64, bits, role="key" if role == "key" else "value")
    q = kq.quantize(_x(shape))
    assert q.num_bits == _expected_kivi(shape, bits, role) == kq.num_bits_for(shape)


def test_kivi_bits_per_component_long_context() -> None:
    # 2-bit KIVI on a 4096-token head: 2 bits + 32/32 per key channel group + the fp16 window.
    kq = KIVI(128, 2, role="key")
    bpc = kq.num_bits_for((1, 1, 4096, 128)) / (4096 * 128)
    assert bpc == pytest.approx((3968 * (2 + 1) + 128 * 16) / 4096)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("quantizer", [Int8Absmax(64), FP8E4M3(64)])
def test_eight_bit_counts(shape: tuple[int, ...], quantizer: Int8Absmax | FP8E4M3) -> None:
    q = quantizer.quantize(_x(shape))
    n_vec = math.prod(shape[:-1])
    assert q.num_bits == 8 * math.prod(shape) + 16 * n_vec == quantizer.num_bits_for(shape)
    assert q.bits_per_component == pytest.approx(8 + 16 / 64)


def test_bits_per_component_of_turboquant() -> None:
    q = TurboQuantMSE(128, 3).quantize(torch.randn(4, 128))
    assert q.bits_per_component == 3 + 16 / 128
    assert TurboQuantProd(128, 3).quantize(torch.randn(4, 128)).bits_per_component == 3.25


NAMES: list[QuantizerName] = ["turboquant_mse", "turboquant_prod", "kivi", "int8", "fp8"]


@pytest.mark.parametrize("name", NAMES)
def test_factory_builds_protocol_conforming_quantizers(name: QuantizerName) -> None:
    bits = 8 if name in ("int8", "fp8") else 3
    q = make_quantizer(name, 64, bits)
    assert isinstance(q, Quantizer)
    assert q.name == name and q.dim == 64 and q.bits == bits
    x = _x((1, 2, 200, 64))
    qx = q.quantize(x)
    assert qx.method == name and qx.shape == x.shape
    out = q.dequantize(qx)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert qx.num_bits == q.num_bits_for(tuple(x.shape))


def test_quantized_tensor_is_frozen() -> None:
    qx = make_quantizer("int8", 8, 8).quantize(torch.randn(2, 8))
    assert isinstance(qx, QuantizedTensor)
    with pytest.raises(dataclasses.FrozenInstanceError):
        qx.scales = None  # type: ignore[misc]

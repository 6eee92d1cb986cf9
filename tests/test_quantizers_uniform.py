"""int8 and fp8 per-vector baselines: error bounds and no clipping."""

from __future__ import annotations

import pytest
import torch

from seqkv.quantizers import FP8E4M3, Int8Absmax


def _data(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, 50, 64, generator=gen) * torch.rand(3, 4, 50, 1, generator=gen) * 20
    x[0, 0, 0] = 0.0  # a zero vector
    x[0, 0, 1, 7] = 300.0  # an outlier
    x[1, 1, 1] = 1e-6  # a tiny vector
    return x


def test_int8_error_is_at_most_half_a_step() -> None:
    q = Int8Absmax(64)
    x = _data()
    qx = q.quantize(x)
    assert qx.scales is not None
    scale = qx.scales.float().unsqueeze(-1)
    assert torch.all(x.abs() <= 127 * scale)  # no clipping
    out = q.dequantize(qx)
    assert torch.all((out - x).abs() <= scale / 2 * (1 + 1e-5))
    assert torch.all(out[0, 0, 0] == 0)
    assert qx.codes is not None
    codes = qx.codes.unpack().view(torch.int8)
    assert int(codes.min()) >= -127 and int(codes.max()) <= 127


def test_fp8_error_is_at_most_half_an_e4m3_spacing() -> None:
    q = FP8E4M3(64)
    x = _data(1)
    qx = q.quantize(x)
    assert qx.scales is not None
    scale = qx.scales.float().unsqueeze(-1)
    assert torch.all(x.abs() <= 448 * scale)
    out = q.dequantize(qx)
    bound = torch.maximum(x.abs() / 16, scale / 1024)
    assert torch.all((out - x).abs() <= bound * (1 + 1e-5))
    assert torch.all(out[0, 0, 0] == 0)
    # Relative error of e4m3 is a few percent: about 2^-4 / sqrt(3) RMS for normal values.
    rel = ((out - x).square().sum(-1) / x.square().sum(-1).clamp_min(1e-30)).sqrt()
    assert 0.01 < float(rel[1:].mean()) < 0.05


@pytest.mark.parametrize("quantizer", [Int8Absmax(16), FP8E4M3(16)])
def test_dtype_is_preserved(quantizer: Int8Absmax | FP8E4M3) -> None:
    x = torch.randn(5, 16, dtype=torch.bfloat16)
    out = quantizer.dequantize(quantizer.quantize(x))
    assert out.dtype == torch.bfloat16 and out.shape == x.shape

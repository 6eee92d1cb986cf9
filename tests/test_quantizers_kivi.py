"""KIVI: half-step error per group, exact 16-bit window, per-channel keys vs per-token values."""

from __future__ import annotations

import pytest
import torch

from seqkv.kernels.common.naive import round_down_fp16, round_up_fp16
from seqkv.quantizers import KIVI, KiviRole


def _kv(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """KV-like data: per-channel offsets and scales spanning two orders of magnitude."""
    gen = torch.Generator().manual_seed(seed)
    dim = shape[-1]
    channel_scale = 10.0 ** torch.linspace(-1, 1, dim)  # [D]
    channel_offset = torch.randn(dim, generator=gen) * 3  # [D]
    return torch.randn(shape, generator=gen) * channel_scale + channel_offset


def _elementwise(kq: KIVI, side: torch.Tensor, n_quant: int) -> torch.Tensor:
    """Expand per-group side info to ``[..., T_q, D]``."""
    if kq.role == "key":  # [..., n_groups, D]
        return side.float().repeat_interleave(kq.group_size, dim=-2)[..., :n_quant, :]
    return side.float().repeat_interleave(kq.group_size, dim=-1)[..., : kq.dim]  # [..., T_q, n_g]


@pytest.mark.parametrize("role", ["key", "value"])
@pytest.mark.parametrize(("bits", "dim", "tokens"), [(2, 64, 300), (4, 40, 200), (1, 64, 131)])
def test_error_within_half_a_step_of_its_group(
    role: KiviRole, bits: int, dim: int, tokens: int
) -> None:
    kq = KIVI(dim, bits, role=role)
    x = _kv((2, 3, tokens, dim))
    q = kq.quantize(x)
    out = kq.dequantize(q)
    n_quant = tokens - 128
    assert q.scales is not None and q.zero_points is not None
    step = _elementwise(kq, q.scales, n_quant)
    err = (out[..., :n_quant, :] - x[..., :n_quant, :]).abs()
    assert torch.all(err <= step / 2 * (1 + 1e-5) + 1e-6 * x[..., :n_quant, :].abs())
    # ... and the bound is nearly attained, so it is the right step.
    assert float((err / step).max()) > 0.45


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("role", ["key", "value"])
def test_recent_window_is_exact(dtype: torch.dtype, role: KiviRole) -> None:
    kq = KIVI(64, 2, role=role)
    x = _kv((1, 2, 300, 64)).to(dtype)
    q = kq.quantize(x)
    assert q.dense is not None and q.dense.dtype == dtype and q.dense.shape[-2] == 128
    out = kq.dequantize(q)
    assert out.dtype == dtype
    assert torch.equal(out[..., -128:, :], x[..., -128:, :])
    assert not torch.equal(out[..., :-128, :], x[..., :-128, :])


def test_short_cache_is_all_window() -> None:
    kq = KIVI(64, 2, role="key")
    x = _kv((1, 1, 100, 64)).half()
    q = kq.quantize(x)
    assert q.codes is not None and q.codes.count == 0
    assert torch.equal(kq.dequantize(q), x)


def _constant_per_channel(tokens: int, dim: int) -> torch.Tensor:
    return (torch.arange(dim) * 0.25 - 3).expand(1, tokens, dim).clone()  # [1, T, D]


def _constant_per_token(tokens: int, dim: int) -> torch.Tensor:
    return (torch.arange(tokens) * 0.125 - 5).unsqueeze(-1).expand(1, tokens, dim).clone()


def test_keys_are_grouped_per_channel() -> None:
    # Each channel is constant along tokens: per-channel groups are constant, hence exact;
    # a per-token grouping would mix 64 different values into 4 levels.
    x = _constant_per_channel(192, 64)
    assert torch.equal(KIVI(64, 2, role="key").dequantize(KIVI(64, 2, role="key").quantize(x)), x)
    vq = KIVI(64, 2, role="value")
    assert float((vq.dequantize(vq.quantize(x)) - x).abs().max()) > 0.1


def test_values_are_grouped_per_token() -> None:
    x = _constant_per_token(192, 64)
    vq = KIVI(64, 2, role="value")
    assert torch.equal(vq.dequantize(vq.quantize(x)), x)
    kq = KIVI(64, 2, role="key")
    assert float((kq.dequantize(kq.quantize(x)) - x).abs().max()) > 0.1


def test_side_info_layout_and_short_last_group() -> None:
    x = _kv((2, 198, 64))  # T_q = 70: key groups of 32, 32 and 6 tokens
    kq = KIVI(64, 2, role="key")
    q = kq.quantize(x)
    assert q.scales is not None and q.zero_points is not None
    assert q.scales.shape == q.zero_points.shape == (2, 3, 64)
    assert q.scales.dtype == q.zero_points.dtype == torch.float16
    tail = x[:, 64:70, :]  # the 6-token group
    lo, hi = tail.amin(dim=1), tail.amax(dim=1)
    zero = round_down_fp16(lo, "zero")
    assert torch.equal(q.zero_points[:, 2], zero)
    assert torch.equal(q.scales[:, 2], round_up_fp16((hi - zero.float()) / 3, "scale"))

    v = _kv((2, 150, 40))  # D = 40: value groups of 32 and 8 channels
    vq = KIVI(40, 2, role="value")
    qv = vq.quantize(v)
    assert qv.scales is not None and qv.scales.shape == (2, 22, 2)
    lo8 = v[:, :22, 32:].amin(dim=-1)
    assert qv.zero_points is not None
    assert torch.equal(qv.zero_points[..., 1], round_down_fp16(lo8, "zero"))


def test_streaming_window_follows_kivi_algorithm_1() -> None:
    x = _kv((1, 300, 64)).half()
    kq = KIVI(64, 2, role="key", window="streaming")
    vq = KIVI(64, 2, role="value", window="streaming")
    assert kq.dense_tokens(300) == 300 % 128 == 44
    assert vq.dense_tokens(300) == 128
    assert kq.dense_tokens(256) == 0
    qk = kq.quantize(x)
    assert qk.dense is not None and qk.dense.shape == (1, 44, 64)
    assert torch.equal(kq.dequantize(qk)[:, -44:], x[:, -44:])


def test_outlier_channel_does_not_spoil_other_keys() -> None:
    # The reason KIVI quantizes keys per channel: one channel 1000x larger than the rest ruins
    # the 31 channels sharing its per-token group, but no other channel under per-channel groups.
    x = torch.randn(1, 160, 64, generator=torch.Generator().manual_seed(3))
    x[..., 5] *= 1000
    per_channel, per_token = KIVI(64, 2, role="key"), KIVI(64, 2, role="value")
    others = [c for c in range(32) if c != 5]
    err_channel = (per_channel.dequantize(per_channel.quantize(x)) - x)[..., :32, others].abs()
    err_token = (per_token.dequantize(per_token.quantize(x)) - x)[..., :32, others].abs()
    assert float(err_channel.max()) < 2.0
    # Per token, the 31 channels collapse onto the zero-point (measured ratio: 6.8).
    assert float(err_token.mean()) > 4 * float(err_channel.mean())

"""The shared building blocks: torch halves against definitions, Triton halves against torch.

The device helpers are exercised through small test kernels over values chosen for their edges
(signed zeros, subnormals, ties, the float16 limits), bit for bit.
"""

from __future__ import annotations

from seqkv.kernels.testing import use_interpreter_without_gpu

use_interpreter_without_gpu()

import math  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from seqkv.kernels._jit import ENABLE_FP_FUSION, kernel, tl  # noqa: E402
from seqkv.kernels.common import naive  # noqa: E402
from seqkv.kernels.common.naive import round_down_fp16, round_up_fp16  # noqa: E402
from seqkv.kernels.common.triton import (  # noqa: E402
    downcast,
    fp16_round_down,
    fp16_round_up,
    round_half_even,
    upcast,
)
from seqkv.kernels.testing import assert_matches, kernel_device  # noqa: E402
from seqkv.kernels.turboquant.naive import walsh_hadamard  # noqa: E402

DEVICE = kernel_device()
_BLOCK = 1024


@kernel
def _helpers_kernel(x_ptr: tl.tensor, round_ptr: tl.tensor, down_ptr: tl.tensor,
                    up_ptr: tl.tensor, bf16_ptr: tl.tensor, n: tl.int64,
                    BLOCK: tl.constexpr) -> None:
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offsets < n
    x = tl.load(x_ptr + offsets, mask=valid, other=0.0)
    tl.store(round_ptr + offsets, round_half_even(tl.minimum(tl.maximum(x, -1e6), 1e6)),
             mask=valid)
    tl.store(down_ptr + offsets, fp16_round_down(x), mask=valid)
    tl.store(up_ptr + offsets, fp16_round_up(x), mask=valid)
    tl.store(bf16_ptr + offsets, downcast(x, tl.bfloat16), mask=valid)


@kernel
def _widen_kernel(x_ptr: tl.tensor, out_ptr: tl.tensor, n: tl.int64,
                  BLOCK: tl.constexpr) -> None:
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offsets < n
    tl.store(out_ptr + offsets, upcast(tl.load(x_ptr + offsets, mask=valid, other=0.0),
                                       tl.float32), mask=valid)


def _edge_values() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    spread = torch.cat([torch.randn(4000, generator=generator) * 10.0 ** e for e in range(-9, 6)])
    halves = torch.arange(-40, 41, dtype=torch.float32) / 2  # ties for rounding
    fp16 = torch.tensor([65504.0, -65504.0, 65505.0, -65520.0, 7e4, 2.0**-24, 2.0**-25, 6e-8,
                         2.0**-14, 2.0**-14 * (1 - 2.0**-11), 0.0, -0.0, 1e-40, -1e-40])
    return torch.cat([spread, halves, fp16])


def test_device_helpers_match_torch_bit_for_bit() -> None:
    x = _edge_values()
    n = x.numel()
    outs = [torch.full((n,), math.nan, device=DEVICE) for _ in range(3)]
    bf16 = torch.full((n,), math.nan, dtype=torch.bfloat16, device=DEVICE)
    _helpers_kernel[(-(-n // _BLOCK),)](x.to(DEVICE), *outs, bf16, n, BLOCK=_BLOCK,
                                        enable_fp_fusion=ENABLE_FP_FUSION)
    assert_matches(outs[0].cpu(), x.clamp(-1e6, 1e6).round(), name="round_half_even")
    in_range = x.abs() <= 65504.0
    assert_matches(outs[1].cpu()[in_range], round_down_fp16(x[in_range], "x").float(),
                   name="fp16_round_down")
    assert_matches(outs[2].cpu()[in_range], round_up_fp16(x[in_range], "x").float(),
                   name="fp16_round_up")
    assert bool(outs[1].cpu()[~in_range].isinf().all() & outs[2].cpu()[~in_range].isinf().all())
    assert_matches(bf16.cpu().view(torch.int16), x.bfloat16().view(torch.int16),
                   name="bf16 bits (round to nearest even)")


def test_bf16_widening_keeps_subnormals() -> None:
    x = torch.tensor([1e-40, -1e-40, 1.0, -3.5, 0.0, -0.0, 1e38]).bfloat16()
    out = torch.full((x.numel(),), math.nan, device=DEVICE)
    _widen_kernel[(1,)](x.to(DEVICE), out, x.numel(), BLOCK=_BLOCK,
                        enable_fp_fusion=ENABLE_FP_FUSION)
    assert_matches(out.cpu().view(torch.int32), x.float().view(torch.int32), name="bf16 widened")


def test_sqrt_rn_is_correctly_rounded() -> None:
    generator = torch.Generator().manual_seed(1)
    s = torch.cat([torch.rand(200_000, generator=generator) * 10.0 ** e for e in range(-30, 30, 6)])
    s = torch.cat([s, torch.tensor([0.0, 1e-45, 3.4e38, 3.594799409256666e-06])])
    want = torch.from_numpy(np.sqrt(s.numpy()))  # numpy's float32 sqrt is the IEEE operation
    assert_matches(naive.sqrt_rn(s), want, name="sqrt_rn")


@pytest.mark.parametrize("width", [1, 2, 3, 8, 13, 64, 96])
def test_tree_sum_adds_adjacent_pairs(width: int) -> None:
    x = torch.randn(3, width, generator=torch.Generator().manual_seed(width))
    padded = 1 << (width - 1).bit_length()
    level = torch.cat([x, torch.zeros(3, padded - width)], dim=-1)  # zeros to a power of two
    while level.shape[-1] > 1:
        level = torch.stack([level[:, 2 * i] + level[:, 2 * i + 1]
                             for i in range(level.shape[-1] // 2)], dim=-1)
    assert_matches(naive.tree_sum(x), level[:, 0], name="tree_sum")


@pytest.mark.parametrize("dim", [2, 8, 128])
def test_butterfly_is_the_sylvester_hadamard_matrix(dim: int) -> None:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)  # Sylvester
    x = torch.randint(-8, 9, (4, dim), generator=torch.Generator().manual_seed(dim)).float()
    # Small integers: every sum is exact, so the order of the additions cannot matter.
    assert_matches(naive.butterfly(x), (x.double() @ h.T).float(), name="butterfly")


@pytest.mark.parametrize("dim", [4, 64, 128])
def test_walsh_hadamard_is_orthonormal_and_its_own_inverse(dim: int) -> None:
    x = torch.randn(5, dim, generator=torch.Generator().manual_seed(dim))
    y = walsh_hadamard(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(walsh_hadamard(y), x, atol=1e-5, rtol=1e-5)
    assert_matches(y, naive.butterfly(x) * torch.tensor(1 / math.sqrt(dim)), name="scale")

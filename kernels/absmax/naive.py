"""Per-vector absmax quantization to int8 or fp8 (e4m3): the torch reference, and the CPU path
of :class:`seqkv.quantizers.Int8Absmax` and :class:`seqkv.quantizers.FP8E4M3`.

Motivation: the plain 8-bit KV-cache formats of serving engines, with one fp16 scale per vector:
``scale = round_up_fp16(max|x| / qmax)``, ``v = clamp(x / scale, -qmax, qmax)``, and the code is
the 8-bit pattern of ``round(v)`` as int8 (``qmax = 127``) or of ``v`` as
``torch.float8_e4m3fn`` (``qmax = 448``, round to nearest even). Dequantizing multiplies the
decoded value by the scale. This module is the reference for ``triton.py``.

Invariants:
1. The fp16 scale is rounded up, so ``|x / scale| <= qmax`` before the clamp up to float32
   rounding: nothing is clipped (enforced; checked: ``tests/test_quantizers_uniform.py``).
2. The divisor ``qmax`` is a device tensor, never a Python scalar (see ``kernels/kivi/naive.py``,
   invariant 2; enforced).
3. Zero vectors get scale 0 and codes of ``+-0`` and decode to zero (enforced).
4. Codes are one byte per component, so the packed stream of
   :mod:`seqkv.kernels.common.bitpack` at 8 bits is the codes themselves in ``[N, D]`` order
   (enforced by construction).
"""

from __future__ import annotations

from typing import Literal

import torch

from ..common.naive import round_up_fp16

AbsmaxFormat = Literal["int8", "fp8_e4m3"]
"""The 8-bit code: symmetric int8 in ``[-127, 127]``, or fp8 e4m3 (``float8_e4m3fn``)."""

INT8_MAX = 127.0
FP8_E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
"""448: e4m3fn's largest finite value."""


def qmax(fmt: AbsmaxFormat) -> float:
    """The largest magnitude a code represents: 127 (int8) or 448 (fp8 e4m3).

    >>> qmax("int8"), qmax("fp8_e4m3")
    (127.0, 448.0)
    """
    return INT8_MAX if fmt == "int8" else FP8_E4M3_MAX


def quantize(x: torch.Tensor, fmt: AbsmaxFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[N, D]`` to codes (uint8 ``[N * D]``) and fp16 scales ``[N]``."""
    flat = x.to(torch.float32)  # [N, D]
    absmax = flat.abs().amax(dim=-1) if flat.numel() else flat.new_zeros(flat.shape[0])
    limit = torch.tensor(qmax(fmt), dtype=torch.float32, device=flat.device)
    scale = round_up_fp16(absmax / limit, "absmax scale")  # [N]
    scale_f = scale.to(torch.float32).unsqueeze(-1)  # [N, 1]
    safe = torch.where(scale_f > 0, scale_f, torch.ones_like(scale_f))
    scaled = (flat / safe).clamp_(-qmax(fmt), qmax(fmt))  # [N, D]
    if fmt == "int8":
        codes = torch.round(scaled).to(torch.int8).view(torch.uint8)
    else:
        codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
    return codes.reshape(-1), scale  # [N * D], [N]


def decode_values(codes: torch.Tensor, fmt: AbsmaxFormat) -> torch.Tensor:
    """uint8 bit patterns to the float32 values they encode."""
    if fmt == "int8":
        return codes.view(torch.int8).to(torch.float32)
    return codes.view(torch.float8_e4m3fn).to(torch.float32)


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, dim: int, fmt: AbsmaxFormat, dtype: torch.dtype
) -> torch.Tensor:
    """Codes ``[N * D]`` and scales ``[N]`` back to rows ``[N, D]`` of ``dtype``."""
    values = decode_values(codes.reshape(-1, dim), fmt)  # [N, D]
    return (values * scales.to(torch.float32).unsqueeze(-1)).to(dtype)  # [N, D]

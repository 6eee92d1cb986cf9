"""The KV residual's uniform quantizer and its inverse: the torch reference and CPU path.

Motivation: :mod:`seqkv.coding.residual` stores ``target - prediction`` (the KV the caller holds
minus the KV recomputation gives) as integer symbols ``round((target - prediction) / (2 t))`` for
a tolerance ``t``, with escapes where a symbol leaves the alphabet or the float32 rebuild misses
the tolerance. This module is that step alone, elementwise, as the reference for ``triton.py``.

Symbols are int32 in ``[-ALPHABET_LIMIT, ALPHABET_LIMIT)``, or ``ESCAPE`` (``= ALPHABET_LIMIT``,
as in :mod:`seqkv.coding.residual`) where the element must be stored verbatim.

Invariants:
1. Same arithmetic as ``seqkv.coding.residual``: the ratio in float64, ties to even, the rebuild
   ``prediction + symbol * float32(2 t)`` in float32, escapes where ``|symbol| >= ALPHABET_LIMIT``
   or ``|rebuilt - target| > t`` (checked: ``tests/test_kernels_residual.py`` compares the
   rebuilt tensor and the escape count with ``encode_residual``'s).
2. Every rebuilt element is within ``t`` of the target: escaped elements are the target itself
   (enforced by construction; checked).
3. The float64 step is a device tensor, never a Python scalar (see ``kernels/kivi/naive.py``;
   enforced).
"""

from __future__ import annotations

import torch

from seqkv.coding.residual import ALPHABET_LIMIT

ESCAPE = ALPHABET_LIMIT
"""The symbol of an escaped element (the same value ``seqkv.coding.residual`` uses)."""


def quantize(
    target: torch.Tensor, prediction: torch.Tensor, tolerance: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symbols (int32, shape of ``target``) and the float32 tensor a decoder rebuilds."""
    target32 = target.to(torch.float32)
    prediction32 = prediction.to(torch.float32)
    step = torch.tensor(2.0 * tolerance, dtype=torch.float64, device=target.device)
    ratio = ((target32.double() - prediction32.double()) / step).round()
    symbols = ratio.clamp(-ALPHABET_LIMIT, ALPHABET_LIMIT).to(torch.int32)
    rebuilt = prediction32 + symbols.to(torch.float32) * step.to(torch.float32)
    escaped = (symbols.abs() >= ALPHABET_LIMIT) | ((rebuilt - target32).abs() > tolerance)
    symbols = torch.where(escaped, torch.full_like(symbols, ESCAPE), symbols)
    return symbols, torch.where(escaped, target32, rebuilt)


def dequantize(prediction: torch.Tensor, symbols: torch.Tensor, tolerance: float) -> torch.Tensor:
    """``prediction + symbol * float32(2 t)`` in float32; escaped elements get the prediction."""
    prediction32 = prediction.to(torch.float32)
    step = torch.tensor(2.0 * tolerance, dtype=torch.float32, device=prediction.device)
    inliers = torch.where(symbols == ESCAPE, torch.zeros_like(symbols), symbols)
    return prediction32 + inliers.to(torch.float32) * step

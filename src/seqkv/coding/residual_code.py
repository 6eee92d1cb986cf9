"""A coded KV residual as stored: its mode, tolerance, per-group scales and coded bytes.

The data of ``seqkv.coding.residual``'s code, without torch, so that a file can be read,
inspected and rewritten (``seqkv.container``) without the numerical stack.

Invariants:
1. ``num_bits`` counts everything the residual decoder reads: the range coder's words, the
   escaped float32 values, one flag bit per group and a float32 per used scale (enforced).
2. ``shape`` is ``[layers, 2, kv_heads, tokens, head_dim]``; a file of format 3 does not store it
   (the decoder knows it from the model and the token count), so a parsed code has ``()`` until
   ``with_shape`` sets it (enforced: the residual decoder refuses a code of another shape).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class ResidualMode(Enum):
    QUANTIZED = "quantized"
    BIT_EXACT = "bit-exact"


@dataclass(frozen=True)
class ResidualCode:
    """A coded residual: the fitted scales, the range-coded symbols and the escaped values."""

    mode: ResidualMode
    tolerance: float
    shape: tuple[int, ...]
    scales: tuple[float, ...]
    words: bytes
    escapes: bytes

    @property
    def num_bits(self) -> int:
        """Coded size: symbols, escaped values, one flag bit per group, a float32 per used scale."""
        used_scales = sum(1 for scale in self.scales if scale != 0.0)
        return 8 * (len(self.words) + len(self.escapes)) + len(self.scales) + 32 * used_scales

    @property
    def num_escapes(self) -> int:
        return len(self.escapes) // 4

    def with_shape(self, shape: tuple[int, ...]) -> ResidualCode:
        return replace(self, shape=shape)

"""A coded KV residual as stored: its mode, tolerance, per-group scales and coded bytes.

The data of ``seqkv.coding.residual``'s code, without torch, so that a file can be read,
inspected and rewritten (``seqkv.formats.skv``) without the numerical stack.

Invariants:
1. ``num_bits`` counts everything the residual decoder reads: the range coder's words, the
   escaped float32 values, one flag bit per group and a float32 per used scale (enforced).
2. ``shape`` is ``[layers, 2, kv_heads, tokens, head_dim]``; a file of format 3 or 4 does not
   store it (the decoder knows it from the model and the token count), so a parsed code has
   ``()`` until ``with_shape`` sets it (enforced: the residual decoder refuses a code of another
   shape).
3. ``check`` accepts exactly the codes ``seqkv.coding.residual.encode_residual`` can write: a
   tolerance that is finite and in ``(0, MAX_TOLERANCE]`` (quantized) or 0 (bit-exact), scales
   that are 0 or finite in ``[MIN_SCALE, MAX_SCALE]``, whole 32-bit words and escapes
   (enforced: readers call it before anything else sees the code).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from enum import Enum

from seqkv.errors import CorruptFileError

# NOTE: symbols beyond +-ALPHABET_LIMIT are escapes. 2**12 keeps the leaky-quantization floor of
# the Laplace model (every one of the 2**13 symbols gets >= 2**-24 mass) near 3e-4 bits/component.
ALPHABET_LIMIT = 1 << 12
MIN_SCALE = 1e-3
# NOTE: the largest scale a real residual fits is about ALPHABET_LIMIT (every symbol escaping);
# a larger one in a file is corruption.
MAX_SCALE = float(2 * ALPHABET_LIMIT)
# NOTE: the decoder adds symbol * 2 * tolerance (|symbol| <= 2**12) in float32, whose largest
# value is 3.4e38: beyond 1e30 that step overflows. No KV component comes near either figure.
MAX_TOLERANCE = 1e30
# NOTE: a tolerance below the smallest normal double (a subnormal, e.g. 1e-320) makes the
# quantizer's step 2 * tolerance round to 0 in float32: such a value means nothing the caller
# could intend, so a tolerance is a positive normal number or exactly (+)0.
MIN_TOLERANCE = sys.float_info.min


def is_tolerance(value: float) -> bool:
    """Whether ``value`` is a tolerance a caller may ask for: exactly +0 (bit-exact), or a
    normal number in ``[MIN_TOLERANCE, MAX_TOLERANCE]`` (``-0``, subnormals, NaN and
    infinities are not).

    >>> [is_tolerance(v) for v in (0.0, -0.0, 1e-4, 1e-320, float("nan"))]
    [True, False, True, False, False]
    """
    if value == 0:
        return math.copysign(1.0, value) > 0
    return math.isfinite(value) and MIN_TOLERANCE <= value <= MAX_TOLERANCE


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

    def check(self) -> ResidualCode:
        """This code, or ``CorruptFileError`` naming what no encoder writes (invariant 3)."""
        if self.mode is ResidualMode.QUANTIZED:
            if not (math.isfinite(self.tolerance) and 0 < self.tolerance <= MAX_TOLERANCE):
                raise CorruptFileError(f"the KV residual's tolerance {self.tolerance!r} is not a "
                                       f"finite number in (0, {MAX_TOLERANCE:g}]")
        elif self.tolerance != 0.0:
            raise CorruptFileError(f"the bit-exact KV residual states a tolerance "
                                   f"{self.tolerance!r}, not 0")
        for scale in self.scales:
            if scale != 0.0 and not (math.isfinite(scale) and MIN_SCALE <= scale <= MAX_SCALE):
                raise CorruptFileError(f"the KV residual holds a scale {scale!r} that is not 0 "
                                       f"or a finite number in [{MIN_SCALE:g}, {MAX_SCALE:g}]")
        if len(self.words) % 4 or len(self.escapes) % 4:
            raise CorruptFileError("the KV residual's code or escapes are not whole 32-bit words")
        return self

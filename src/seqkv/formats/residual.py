"""The parts two formats share (``seqkv.formats.skv``, ``seqkv.formats.span``): the KV residual's
section, as a ``.skv`` file's third section holds it, and the size of a dictionary digest.

The residual's layout::

    mode        u8      0 quantized at a tolerance, 1 bit-exact
    [tolerance] f64     (quantized)
    groups      varint  (layer, K/V) groups; then a bitmap of the used ones
    scales      f32     one per used group
    escapes     varint  escaped components; then the range coder's words, then the escaped
                        float32 values

Invariants:
1. ``decode_residual_section`` reads only what ``encode_residual_section`` writes (no bitmap bit
   past the groups, no zero scale marked used) and checks the rest (``ResidualCode.check``),
   raising ``CorruptFileError`` (enforced; ``tests/test_fuzz_skv.py``).
2. This module imports neither torch nor transformers (enforced by ``tests/test_layering.py``).
"""

from __future__ import annotations

import math
import struct

from seqkv.coding.residual_code import ResidualCode, ResidualMode
from seqkv.errors import CorruptFileError
from seqkv.formats.framing import SectionReader, encode_varint
from seqkv.limits import MAX_GROUPS

DICTIONARY_DIGEST_BYTES = 32


def encode_residual_section(residual: ResidualCode) -> bytes:
    """The residual's bytes as a file's third section holds them (see the module docstring)."""
    used = [i for i, scale in enumerate(residual.scales) if scale != 0.0]
    bitmap = bytearray((len(residual.scales) + 7) // 8)
    for index in used:
        bitmap[index // 8] |= 1 << (index % 8)
    quantized = residual.mode is ResidualMode.QUANTIZED
    return b"".join([
        bytes([0 if quantized else 1]),
        struct.pack("<d", residual.tolerance) if quantized else b"",
        encode_varint(len(residual.scales)), bytes(bitmap),
        b"".join(struct.pack("<f", residual.scales[i]) for i in used),
        encode_varint(len(residual.escapes) // 4), residual.words, residual.escapes,
    ])


def decode_residual_section(section: bytes) -> ResidualCode:
    """The residual a third section holds, checked (``ResidualCode.check``); its shape is set by
    the decoder (``with_shape``)."""
    reader = SectionReader(section, "the .skv residual", CorruptFileError)
    mode_byte = reader.u8("mode")
    if mode_byte not in (0, 1):
        raise CorruptFileError(f"the .skv residual has unknown mode {mode_byte}")
    mode = ResidualMode.QUANTIZED if mode_byte == 0 else ResidualMode.BIT_EXACT
    tolerance = reader.f64("tolerance") if mode_byte == 0 else 0.0
    groups = reader.varint("group count", 2, MAX_GROUPS)
    if groups % 2:
        raise CorruptFileError(f"the .skv residual has {groups} groups: not a key and a value "
                               "group per layer")
    bitmap = reader.take((groups + 7) // 8, "group bitmap")
    if groups % 8 and bitmap[-1] >> (groups % 8):
        raise CorruptFileError("the .skv residual's group bitmap sets bits past its groups")
    used = [i for i in range(groups) if bitmap[i // 8] >> (i % 8) & 1]
    raw = reader.take(4 * len(used), "scales")
    values = dict(zip(used, struct.unpack(f"<{len(used)}f", raw), strict=True))
    scales = tuple(float(values.get(i, 0.0)) for i in range(groups))
    if any(values[i] == 0.0 for i in used):
        raise CorruptFileError("the .skv residual marks a group used whose scale is 0")
    escapes = reader.varint("escape count")
    rest = reader.rest()
    if 4 * escapes > len(rest):
        raise CorruptFileError("the .skv residual declares more escapes than it holds")
    split = len(rest) - 4 * escapes
    code = ResidualCode(mode, tolerance, (), scales, rest[:split], rest[split:]).check()
    if not all(math.isfinite(value) for (value,) in struct.iter_unpack("<f", code.escapes)):
        raise CorruptFileError("the .skv residual escapes a value that is not finite")
    return code

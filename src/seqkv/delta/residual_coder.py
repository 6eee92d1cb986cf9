"""The residual coder: per-position quantization of ``KV - prediction`` with any per-vector
quantizer, and entropy coding of the quantizer's integer codes under fitted categoricals.

Motivation: a quantizer's packed codes spend ``b`` bits on every code, but the codes are far
from uniform (int8 codes of a max-abs-scaled vector crowd around 0; Lloyd-Max cells are not
equiprobable), so storing them packed overstates the real rate. Here the codes of every
(layer, K/V, code width) group are range-coded (constriction) under a categorical fitted to that
group's histogram; the fitted frequencies are stored and counted, and a group whose fitted code
plus table would not beat its packed size is coded under the uniform law instead (exactly ``b``
bits per code, no table). Side information (norms, scales, zero-points, QJL signs) stays as the
quantizer stores it and is counted at its stored size.

Layout: the residual of one position is ``[layers, 2, kv_heads, 1, head_dim]`` (a ``T = 1``
slice of the cache), quantized at that position's width. Codes are coded group by group: for
each layer, for K then V, for each width in increasing order, the codes of all positions with
that width in position order (heads, then dims, within a position).

Invariants:
1. ``decode_symbols(encode_symbols(c, w), w, shape) == c`` for any codes ``c`` that fit their
   widths ``w`` (checked: ``tests/test_delta_residual_coder.py``).
2. ``SymbolCode.num_bits`` counts everything the decoder reads: the range coder's 32-bit words,
   one flag bit per group, ``TABLE_ENTRY_BITS`` per symbol of each fitted table (enforced by
   construction; the tests recount it).
3. A uniform-coded group costs ``b`` bits per code inside the range coder, so the code exceeds
   the packed size by at most the flags, one final word and range-coder rounding (checked).
4. Quantizers see the residual as a ``T = 1`` slice (enforced). KIVI therefore runs in its
   value layout (per-token groups of channels) for keys too, with no full-precision window:
   per-channel key groups span 32 *future* positions, whose residuals depend on this position's
   decoded value in a closed loop (deviation from KIVI, stated).

Deviations: CacheGen fits one CDF per (layer, channel); here one categorical per (layer, K/V,
width) over all heads and channels, because TurboQuant's rotation mixes channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import constriction
import numpy as np
import numpy.typing as npt
import torch

from seqkv.errors import CorruptCodeError, DeltaConfigError
from seqkv.quantizers import KIVI, PackedCodes, QuantizedTensor, Quantizer, QuantizerName
from seqkv.quantizers import make_quantizer as _make_quantizer
from seqkv.quantizers.bitpack import MAX_BITS, MIN_BITS
from seqkv.quantizers.kivi import DEFAULT_GROUP_SIZE

TABLE_ENTRY_BITS = 16
"""Stored size of one fitted frequency (uint16)."""
TABLE_FLAG_BITS = 1
"""Per group: fitted table or uniform law."""
WORD_BITS = 32
"""constriction's range coder emits 32-bit words."""
_MAX_FREQUENCY = (1 << TABLE_ENTRY_BITS) - 1

FIXED_WIDTHS: dict[QuantizerName, int] = {"int8": 8, "fp8": 8}
"""Quantizers with one code width only."""


def supported_bits(name: QuantizerName) -> tuple[int, ...]:
    """Widths ``name`` can quantize a residual at.

    >>> supported_bits("int8"), supported_bits("kivi")[:3]
    ((8,), (1, 2, 3))
    """
    if name in FIXED_WIDTHS:
        return (FIXED_WIDTHS[name],)
    return tuple(range(MIN_BITS, MAX_BITS + 1))


def make_residual_quantizer(name: QuantizerName, dim: int, bits: int, seed: int = 0) -> Quantizer:
    """The quantizer the delta coder uses for ``name`` at ``bits`` (KIVI: value layout, no
    window; see invariant 4)."""
    if bits not in supported_bits(name):
        raise DeltaConfigError(
            f"quantizer {name!r} cannot code a residual at {bits} bits; it supports "
            f"{supported_bits(name)}"
        )
    if name == "kivi":
        return KIVI(dim, bits, role="value", group_size=DEFAULT_GROUP_SIZE, residual_length=0)
    return _make_quantizer(name, dim, bits, seed=seed)


class ResidualQuantizerBank:
    """One quantizer per width for a method, dim and seed; built on first use."""

    def __init__(self, name: QuantizerName, dim: int, seed: int = 0) -> None:
        self.name = name
        self.dim = dim
        self.seed = seed
        self._quantizers: dict[int, Quantizer] = {}

    def quantizer(self, bits: int) -> Quantizer:
        if bits not in self._quantizers:
            self._quantizers[bits] = make_residual_quantizer(self.name, self.dim, bits,
                                                             self.seed)
        return self._quantizers[bits]

    def code_bits(self, bits: int) -> int | None:
        """Width of the entropy-coded stream at ``bits`` (TurboQuant_prod: ``bits - 1``)."""
        if self.name == "turboquant_prod":
            return bits - 1 if bits > 1 else None
        return bits

    def quantize(self, residual: torch.Tensor, bits: int) -> QuantizedTensor:
        """Quantize one position ``[layers, 2, kv_heads, head_dim]`` at ``bits``."""
        return self.quantizer(bits).quantize(residual.unsqueeze(-2))  # [L, 2, H, 1, D]

    def dequantize(self, q: QuantizedTensor, bits: int) -> torch.Tensor:
        """``[layers, 2, kv_heads, head_dim]`` float32 from a position quantized at ``bits``."""
        out = self.quantizer(bits).dequantize(q)  # [L, 2, H, 1, D]
        return out.squeeze(-2).to(torch.float32)  # [L, 2, H, D]


def split_codes(q: QuantizedTensor) -> tuple[QuantizedTensor, torch.Tensor | None]:
    """``q`` without its main code stream, and that stream's codes (``None`` if it has none)."""
    if q.codes is None:
        return q, None
    return replace(q, codes=None), q.codes.unpack()


def join_codes(stripped: QuantizedTensor, codes: torch.Tensor | None,
               bits: int | None) -> QuantizedTensor:
    """Inverse of :func:`split_codes`."""
    if codes is None or bits is None:
        return stripped
    return replace(stripped, codes=PackedCodes.pack(codes, bits))


@dataclass(frozen=True)
class SymbolTable:
    """The law of one group's codes: fitted frequencies, or ``None`` for uniform."""

    layer: int
    kv: int
    bits: int
    frequencies: tuple[int, ...] | None

    @property
    def num_bits(self) -> int:
        table = 0 if self.frequencies is None else TABLE_ENTRY_BITS * (1 << self.bits)
        return TABLE_FLAG_BITS + table

    def probabilities(self) -> npt.NDArray[np.float64]:
        size = 1 << self.bits
        if self.frequencies is None:
            return np.full(size, 1.0 / size)
        freq = np.asarray(self.frequencies, dtype=np.float64)
        probabilities: npt.NDArray[np.float64] = freq / freq.sum()
        return probabilities

    def model(self) -> constriction.stream.model.Categorical:
        return constriction.stream.model.Categorical(self.probabilities(), perfect=False)


@dataclass(frozen=True)
class SymbolCode:
    """Range-coded codes of every position, with the laws they were coded under."""

    words: bytes
    tables: tuple[SymbolTable, ...]
    num_symbols: int
    packed_bits: int
    """``sum(code width)`` over all codes: their packed size without byte padding."""

    @property
    def payload_bits(self) -> int:
        return 8 * len(self.words)

    @property
    def table_bits(self) -> int:
        return sum(t.num_bits for t in self.tables)

    @property
    def num_bits(self) -> int:
        return self.payload_bits + self.table_bits


def fit_table(layer: int, kv: int, bits: int, symbols: npt.NDArray[np.int64]) -> SymbolTable:
    """The cheaper of a fitted categorical (with its table) and the uniform law."""
    size = 1 << bits
    counts = np.bincount(symbols, minlength=size).astype(np.float64)
    if counts.size != size:
        raise CorruptCodeError(f"a code exceeds {bits} bits: max {int(symbols.max())}")
    peak = counts.max()
    freq = np.where(counts > 0, np.maximum(1.0, np.round(counts * _MAX_FREQUENCY / peak)), 0.0)
    probs = freq / freq.sum()
    observed = counts > 0
    fitted_bits = float(-(counts[observed] * np.log2(probs[observed])).sum())
    fitted_bits += TABLE_ENTRY_BITS * size
    if fitted_bits < bits * symbols.size:
        return SymbolTable(layer, kv, bits, tuple(int(f) for f in freq))
    return SymbolTable(layer, kv, bits, None)


def _groups(num_layers: int, code_bits: Sequence[int | None]) -> list[tuple[int, int, int]]:
    widths = sorted({b for b in code_bits if b is not None})
    return [(layer, kv, b) for layer in range(num_layers) for kv in (0, 1) for b in widths]


def encode_symbols(codes: Sequence[torch.Tensor | None],
                   code_bits: Sequence[int | None]) -> SymbolCode:
    """Range-code the codes of every position (each ``[layers, 2, ...]``, or ``None``)."""
    if len(codes) != len(code_bits):
        raise CorruptCodeError(f"{len(codes)} code arrays for {len(code_bits)} widths")
    present = [i for i, c in enumerate(codes) if c is not None]
    for i in present:
        if code_bits[i] is None:
            raise CorruptCodeError(f"position {i} has codes but no width")
    if not present:
        return SymbolCode(b"", (), 0, 0)
    first = codes[present[0]]
    assert first is not None
    num_layers = first.shape[0]
    stacked = np.zeros((len(codes), num_layers, 2, first[0, 0].numel()), dtype=np.int64)
    for i in present:
        c = codes[i]
        assert c is not None
        stacked[i] = c.reshape(num_layers, 2, -1).numpy()  # [L, 2, H * D]
    widths = np.array([-1 if b is None else b for b in code_bits])
    encoder = constriction.stream.queue.RangeEncoder()
    tables = []
    total = 0
    packed = 0
    for layer, kv, bits in _groups(num_layers, code_bits):
        chosen = np.flatnonzero(widths == bits)
        symbols = stacked[chosen, layer, kv].reshape(-1)  # [n_positions * H * D]
        table = fit_table(layer, kv, bits, symbols)
        encoder.encode(symbols.astype(np.int32), table.model())
        tables.append(table)
        total += symbols.size
        packed += bits * symbols.size
    words = encoder.get_compressed().astype("<u4").tobytes()
    return SymbolCode(words, tuple(tables), total, packed)


def decode_symbols(code: SymbolCode, code_bits: Sequence[int | None],
                   position_shape: tuple[int, ...]) -> list[torch.Tensor | None]:
    """The codes of every position, each of ``position_shape`` (``[layers, 2, ...]``)."""
    num_layers = position_shape[0]
    per_group = int(np.prod(position_shape[2:]))
    groups = _groups(num_layers, code_bits)
    if [(t.layer, t.kv, t.bits) for t in code.tables] != groups:
        raise CorruptCodeError(
            "the symbol tables do not match the stored widths: the code is corrupt"
        )
    widths = np.array([-1 if b is None else b for b in code_bits])
    stacked = np.zeros((len(code_bits), num_layers, 2, per_group), dtype=np.int64)
    decoder = constriction.stream.queue.RangeDecoder(
        np.frombuffer(code.words, dtype="<u4").astype(np.uint32)
    )
    for table in code.tables:
        chosen = np.flatnonzero(widths == table.bits)
        symbols = decoder.decode(table.model(), chosen.size * per_group)
        # [n_positions * H * D] -> [n_positions, H * D]
        stacked[chosen, table.layer, table.kv] = symbols.reshape(chosen.size, per_group)
    return [  # each [L, 2, H * D] -> position_shape, e.g. [L, 2, H, 1, D]
        None if b is None else torch.from_numpy(stacked[i]).to(torch.uint8).reshape(
            position_shape)
        for i, b in enumerate(code_bits)
    ]

"""The residual coder: entropy coding of quantizer codes, its exact bit count, and the quantizer
bank's per-position layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv.delta.residual_coder import (
    TABLE_ENTRY_BITS,
    TABLE_FLAG_BITS,
    WORD_BITS,
    ResidualQuantizerBank,
    SymbolCode,
    decode_symbols,
    encode_symbols,
    join_codes,
    make_residual_quantizer,
    split_codes,
)
from seqkv.errors import CorruptCodeError, DeltaConfigError

SHAPE = (3, 2, 2, 1, 8)  # one position: [L, 2, H, 1, D]


def _skewed(generator: torch.Generator, bits: int, count: int) -> list[torch.Tensor | None]:
    # Geometric-like codes: most mass on 0, 1, 2 (far from uniform).
    out: list[torch.Tensor | None] = []
    for _ in range(count):
        u = torch.rand(SHAPE, generator=generator)
        codes = torch.floor(-torch.log2(u.clamp_min(1e-9))).clamp(0, (1 << bits) - 1)
        out.append(codes.to(torch.uint8))
    return out


def _recount(code: SymbolCode) -> int:
    tables = sum(TABLE_FLAG_BITS + (0 if t.frequencies is None else
                                    TABLE_ENTRY_BITS * (1 << t.bits)) for t in code.tables)
    return 8 * len(code.words) + tables


@given(st.integers(0, 2**31), st.lists(st.sampled_from([None, 1, 2, 3, 8]), min_size=1,
                                       max_size=12))
def test_symbols_round_trip_with_exact_bit_count(seed: int, widths: list[int | None]) -> None:
    generator = torch.Generator().manual_seed(seed)
    codes: list[torch.Tensor | None] = []
    for bits in widths:
        if bits is None:
            codes.append(None)
        else:
            codes.append(torch.randint(0, 1 << bits, SHAPE, generator=generator,
                                       dtype=torch.uint8))
    code = encode_symbols(codes, widths)
    decoded = decode_symbols(code, widths, SHAPE)
    for got, want in zip(decoded, codes, strict=True):
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert torch.equal(got, want)
    assert code.num_bits == _recount(code) == code.payload_bits + code.table_bits
    assert len(code.words) % (WORD_BITS // 8) == 0
    assert code.packed_bits == sum(int(np.prod(SHAPE)) * b for b in widths if b is not None)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_entropy_coded_size_is_below_the_packed_size_on_skewed_symbols(bits: int) -> None:
    widths: list[int | None] = [bits] * 400
    codes = _skewed(torch.Generator().manual_seed(bits), bits, len(widths))
    code = encode_symbols(codes, widths)
    assert all(t.frequencies is not None for t in code.tables)
    assert code.num_bits <= code.packed_bits
    assert torch.equal(torch.stack(decode_symbols(code, widths, SHAPE)),  # type: ignore[arg-type]
                       torch.stack(codes))  # type: ignore[arg-type]


def test_uniform_symbols_fall_back_to_the_uniform_law() -> None:
    generator = torch.Generator().manual_seed(0)
    widths: list[int | None] = [3] * 50
    codes: list[torch.Tensor | None] = [
        torch.randint(0, 8, SHAPE, generator=generator, dtype=torch.uint8) for _ in widths]
    code = encode_symbols(codes, widths)
    assert all(t.frequencies is None for t in code.tables)
    # b bits per code inside the range coder: the flags and one final word over the packed size.
    assert code.num_bits <= code.packed_bits + len(code.tables) + WORD_BITS


def test_mismatched_widths_are_refused_at_decode() -> None:
    widths: list[int | None] = [2, 2]
    codes: list[torch.Tensor | None] = [torch.zeros(SHAPE, dtype=torch.uint8)] * 2
    code = encode_symbols(codes, widths)
    with pytest.raises(CorruptCodeError, match="do not match the stored widths"):
        decode_symbols(code, [2, 3], SHAPE)


def test_codes_without_a_width_are_refused() -> None:
    with pytest.raises(CorruptCodeError, match="has codes but no width"):
        encode_symbols([torch.zeros(SHAPE, dtype=torch.uint8)], [None])


def test_fixed_width_quantizers_refuse_other_widths() -> None:
    with pytest.raises(DeltaConfigError, match="supports"):
        make_residual_quantizer("int8", 8, 3)


@pytest.mark.parametrize(("name", "bits"), [("turboquant_mse", 2), ("turboquant_prod", 3),
                                            ("turboquant_prod", 1), ("kivi", 2), ("int8", 8),
                                            ("fp8", 8)])
def test_bank_quantizes_one_position_and_split_join_is_lossless(name: str, bits: int) -> None:
    bank = ResidualQuantizerBank(name, 8)  # type: ignore[arg-type]
    residual = torch.randn(SHAPE[:3] + SHAPE[4:], generator=torch.Generator().manual_seed(1))
    q = bank.quantize(residual, bits)
    assert q.shape == SHAPE
    stripped, codes = split_codes(q)
    assert stripped.codes is None
    assert (codes is None) == (bank.code_bits(bits) is None)
    rebuilt = join_codes(stripped, codes, bank.code_bits(bits))
    assert torch.equal(bank.dequantize(rebuilt, bits), bank.dequantize(q, bits))
    assert bank.dequantize(q, bits).shape == residual.shape


def test_kivi_runs_in_its_value_layout_without_a_window() -> None:
    quantizer = make_residual_quantizer("kivi", 64, 2)
    assert quantizer.num_bits_for((1, 64)) == 64 * 2 + 2 * 32  # 2 groups: fp16 scale + zero

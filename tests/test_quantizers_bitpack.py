"""Bit packing: exact round trip and exact byte counts for every width 1..8 and odd lengths."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv.quantizers.base import PackedCodes
from seqkv.quantizers.bitpack import pack_bits, packed_nbytes, unpack_bits


@given(
    bits=st.integers(min_value=1, max_value=8),
    length=st.integers(min_value=0, max_value=301),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
)
def test_round_trip_and_byte_count(bits: int, length: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (length,), generator=gen)
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == (length * bits + 7) // 8 == packed_nbytes(length, bits)
    assert torch.equal(unpack_bits(packed, bits, length).long(), codes)


@given(bits=st.integers(min_value=1, max_value=8), length=st.integers(0, 40))
def test_extreme_codes_survive(bits: int, length: int) -> None:
    codes = torch.full((length,), (1 << bits) - 1)
    codes[::2] = 0
    assert torch.equal(unpack_bits(pack_bits(codes, bits), bits, length).long(), codes)


def test_known_layout_lsb_first() -> None:
    # 3-bit codes 5 (101), 3 (011), 6 (110): stream LSB first = 1,0,1, 1,1,0, 0,1,1 (+ padding)
    packed = pack_bits(torch.tensor([5, 3, 6]), 3)
    assert packed.tolist() == [0b10011101, 0b00000001]


def test_packed_codes_keep_shape_and_count_bits() -> None:
    codes = torch.randint(0, 8, (3, 5, 7), generator=torch.Generator().manual_seed(0))
    packed = PackedCodes.pack(codes, 3)
    assert packed.unpack().shape == (3, 5, 7)
    assert torch.equal(packed.unpack().long(), codes)
    assert packed.num_valid_bits == 105 * 3
    assert packed.num_bits == 8 * 40  # ceil(315 / 8) = 40 bytes


def test_multidimensional_codes_flatten_in_row_major_order() -> None:
    codes = torch.arange(16).reshape(4, 4) % 4
    assert torch.equal(unpack_bits(pack_bits(codes, 2), 2, 16).long(), codes.reshape(-1))

"""One ``pytest.raises`` per precondition of the quantizers."""

from __future__ import annotations

import pytest
import torch

from seqkv.errors import (
    InvalidTensorDtypeError,
    InvalidTensorError,
    QuantizedDataMismatchError,
    QuantizerConfigError,
)
from seqkv.quantizers import (
    KIVI,
    Int8Absmax,
    PackedCodes,
    TurboQuantMSE,
    TurboQuantProd,
    lloyd_max_codebook,
    make_quantizer,
    pack_bits,
    unpack_bits,
)


def test_hadamard_needs_power_of_two_dim() -> None:
    with pytest.raises(QuantizerConfigError, match="power-of-two"):
        TurboQuantMSE(96, 3, rotation="hadamard")


def test_turboquant_bits_out_of_range() -> None:
    with pytest.raises(QuantizerConfigError, match="bits must be"):
        TurboQuantMSE(64, 0)


def test_turboquant_prod_bits_out_of_range() -> None:
    with pytest.raises(QuantizerConfigError, match="bits must be"):
        TurboQuantProd(64, 9)


def test_kivi_bits_out_of_range() -> None:
    with pytest.raises(QuantizerConfigError, match="bits must be"):
        KIVI(64, 9)


def test_pack_bits_out_of_range() -> None:
    with pytest.raises(QuantizerConfigError, match="bits must be"):
        pack_bits(torch.tensor([0, 1]), 0)


def test_pack_codes_out_of_range() -> None:
    with pytest.raises(InvalidTensorError, match=r"codes must lie in \[0, 4\)"):
        pack_bits(torch.tensor([0, 4]), 2)


def test_pack_float_codes() -> None:
    with pytest.raises(InvalidTensorDtypeError, match="integer tensor"):
        pack_bits(torch.tensor([0.0, 1.0]), 2)


def test_unpack_wrong_byte_count() -> None:
    with pytest.raises(InvalidTensorError, match="need exactly 2 bytes"):
        unpack_bits(torch.zeros(3, dtype=torch.uint8), 3, 5)


def test_packed_codes_inconsistent() -> None:
    with pytest.raises(InvalidTensorError, match="need 1 bytes"):
        PackedCodes(data=torch.zeros(2, dtype=torch.uint8), bits=2, shape=(4,))


def test_wrong_last_dim() -> None:
    with pytest.raises(InvalidTensorError, match="last dimension must equal"):
        TurboQuantMSE(64, 2).quantize(torch.randn(3, 128))


def test_wrong_last_dim_kivi() -> None:
    with pytest.raises(InvalidTensorError, match="last dimension must equal"):
        KIVI(64).quantize(torch.randn(1, 200, 32))


def test_kivi_needs_token_axis() -> None:
    with pytest.raises(InvalidTensorError, match="at least 2 dims"):
        KIVI(64).quantize(torch.randn(64))


def test_kivi_unknown_role() -> None:
    with pytest.raises(QuantizerConfigError, match="role must be"):
        KIVI(64, role="query")  # type: ignore[arg-type]


def test_kivi_streaming_needs_whole_groups() -> None:
    with pytest.raises(QuantizerConfigError, match="multiple of group_size"):
        KIVI(64, window="streaming", residual_length=100)


def test_integer_input() -> None:
    with pytest.raises(InvalidTensorDtypeError, match="floating-point"):
        Int8Absmax(4).quantize(torch.ones(2, 4, dtype=torch.int32))


def test_non_finite_input() -> None:
    with pytest.raises(InvalidTensorError, match="NaN or inf"):
        TurboQuantMSE(4, 2).quantize(torch.tensor([[1.0, float("nan"), 0.0, 0.0]]))


def test_norm_beyond_fp16() -> None:
    with pytest.raises(InvalidTensorError, match="float16 range"):
        TurboQuantMSE(4, 2).quantize(torch.full((1, 4), 1e5))


def test_dequantize_foreign_tensor() -> None:
    q = Int8Absmax(8).quantize(torch.randn(2, 8))
    with pytest.raises(QuantizedDataMismatchError, match="cannot dequantize"):
        TurboQuantMSE(8, 2).dequantize(q)


def test_dequantize_other_dim() -> None:
    q = TurboQuantMSE(8, 2).quantize(torch.randn(2, 8))
    with pytest.raises(QuantizedDataMismatchError, match="not quantized with dim=16"):
        TurboQuantMSE(16, 2).dequantize(q)


def test_inner_product_query_dim() -> None:
    q = TurboQuantProd(8, 2)
    with pytest.raises(InvalidTensorError, match="last dimension must equal"):
        q.inner_product(torch.randn(1, 16), q.quantize(torch.randn(3, 8)))


def test_lloyd_max_dim_too_small() -> None:
    with pytest.raises(QuantizerConfigError, match="dim must be at least 2"):
        lloyd_max_codebook(1, 2)


def test_factory_eight_bit_formats_need_bits_8() -> None:
    with pytest.raises(QuantizerConfigError, match="pass bits=8"):
        make_quantizer("int8", 64, 4)


def test_factory_unknown_name() -> None:
    with pytest.raises(QuantizerConfigError, match="unknown quantizer"):
        make_quantizer("nf4", 64, 4)  # type: ignore[call-overload]


def test_dequantize_other_bit_width() -> None:
    q = TurboQuantMSE(8, 3).quantize(torch.randn(2, 8))
    with pytest.raises(QuantizedDataMismatchError, match="holds 3-bit codes"):
        TurboQuantMSE(8, 4).dequantize(q)


def test_dequantize_kivi_other_role() -> None:
    q = KIVI(64, 2, role="key").quantize(torch.randn(1, 200, 64))
    with pytest.raises(QuantizedDataMismatchError, match="another KIVI role"):
        KIVI(64, 2, role="value").dequantize(q)

"""Bit packing of b-bit integer codes into a dense uint8 byte stream.

Motivation: a quantizer's honest size is its packed size. Storing 2-bit codes one per byte would
quadruple the payload, so every quantizer keeps its codes packed, and its bit count is read off
the packed streams rather than computed from a formula. This is the torch implementation of the
format, used by every op's reference (and so by the quantizers on CPU); the kernels pack inside
their launches with the device twins ``pack_words`` / ``unpack_words`` in ``triton.py``, which
write the same bytes.

Format: codes are laid out one after another, least significant bit first, in a single bit
stream; the stream is cut into bytes, least significant bit first within each byte, and the last
byte is padded with zero bits. ``count`` codes of ``bits`` bits therefore occupy exactly
``ceil(count * bits / 8)`` bytes, and at most 7 of those bits are padding.

Invariants:
1. ``unpack_bits(pack_bits(c, b), b, c.numel())`` equals ``c.reshape(-1)`` for every integer
   tensor ``c`` with values in ``[0, 2**b)`` and every ``b`` in 1..8 (checked:
   ``tests/test_quantizers_bitpack.py``, hypothesis over bits and odd lengths).
2. ``pack_bits`` output has exactly ``packed_nbytes(count, bits)`` bytes (enforced by
   construction; checked by the same tests and by ``PackedCodes.__post_init__``).
3. Codes outside ``[0, 2**b)`` are rejected, never silently truncated (enforced:
   ``InvalidTensorError``).
"""

from __future__ import annotations

import torch

from seqkv.errors import InvalidTensorDtypeError, InvalidTensorError, QuantizerConfigError

MIN_BITS = 1
MAX_BITS = 8


def check_bits(bits: int) -> None:
    """Raise ``QuantizerConfigError`` unless ``bits`` is a supported code width (1..8)."""
    if not MIN_BITS <= bits <= MAX_BITS:
        raise QuantizerConfigError(
            f"bits must be an integer in {MIN_BITS}..{MAX_BITS}, got {bits}; "
            "wider codes do not fit one byte"
        )


def packed_nbytes(count: int, bits: int) -> int:
    """Number of bytes that ``count`` codes of ``bits`` bits occupy once packed.

    >>> packed_nbytes(5, 3)
    2
    >>> packed_nbytes(0, 7)
    0
    """
    check_bits(bits)
    if count < 0:
        raise InvalidTensorError(f"count must be non-negative, got {count}")
    return (count * bits + 7) // 8


_CODES_PER_WORD = 8
"""Eight ``b``-bit codes fill exactly ``b`` bytes; they are assembled in one int64 word."""


def _byte_shifts(bits: int, device: torch.device) -> torch.Tensor:
    return torch.arange(0, 8 * bits, 8, dtype=torch.int64, device=device)  # [bits]


def _code_shifts(bits: int, device: torch.device) -> torch.Tensor:
    return torch.arange(0, _CODES_PER_WORD * bits, bits, dtype=torch.int64, device=device)  # [8]


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer ``codes`` (any shape, values in ``[0, 2**bits)``) into a 1-D uint8 tensor.

    >>> pack_bits(torch.tensor([1, 2, 3]), 2)
    tensor([57], dtype=torch.uint8)
    """
    check_bits(bits)
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise InvalidTensorDtypeError(f"codes must be an integer tensor, got dtype {codes.dtype}")
    flat = codes.reshape(-1)  # [N]
    count = flat.numel()
    if count > 0:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= 1 << bits:
            raise InvalidTensorError(
                f"codes must lie in [0, {1 << bits}) for bits={bits}, got range [{lo}, {hi}]"
            )
    if bits == MAX_BITS:
        return flat.to(torch.uint8)
    device = flat.device
    wide = flat.to(torch.int64)
    pad = (-count) % _CODES_PER_WORD
    if pad:
        wide = torch.cat([wide, wide.new_zeros(pad)])
    groups = wide.reshape(-1, _CODES_PER_WORD)  # [W, 8]
    # NOTE: the shifted codes occupy disjoint bit ranges, so their sum is their bitwise OR.
    words = (groups << _code_shifts(bits, device)).sum(dim=-1)  # [W], 8 * bits <= 56 bits
    octets = (words.unsqueeze(-1) >> _byte_shifts(bits, device)) & 0xFF  # [W, bits]
    return octets.reshape(-1)[: packed_nbytes(count, bits)].to(torch.uint8)  # [nbytes]


def unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``count`` codes, as a 1-D uint8 tensor.

    >>> unpack_bits(torch.tensor([57], dtype=torch.uint8), 2, 3)
    tensor([1, 2, 3], dtype=torch.uint8)
    """
    check_bits(bits)
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise InvalidTensorDtypeError(
            f"packed must be a 1-D uint8 tensor, got dtype {packed.dtype} with {packed.dim()} dims"
        )
    need = packed_nbytes(count, bits)
    if packed.numel() != need:
        raise InvalidTensorError(
            f"{count} codes of {bits} bits need exactly {need} bytes, got {packed.numel()}"
        )
    if bits == MAX_BITS:
        return packed.clone()
    device = packed.device
    wide = packed.to(torch.int64)
    pad = (-need) % bits
    if pad:
        wide = torch.cat([wide, wide.new_zeros(pad)])
    octets = wide.reshape(-1, bits)  # [W, bits]
    words = (octets << _byte_shifts(bits, device)).sum(dim=-1)  # [W]
    codes = (words.unsqueeze(-1) >> _code_shifts(bits, device)) & ((1 << bits) - 1)  # [W, 8]
    return codes.reshape(-1)[:count].to(torch.uint8)  # [count]

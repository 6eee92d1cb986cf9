"""Bit packing of b-bit integer codes into a dense uint8 byte stream.

Motivation: a quantizer's honest size is its packed size. Storing 2-bit codes one per byte would
quadruple the payload, so every quantizer in this package keeps its codes packed, and its bit
count is read off the packed streams rather than computed from a formula.

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
3. Codes outside ``[0, 2**b)`` are rejected, never silently truncated (enforced: ValueError).
"""

from __future__ import annotations

import torch

MIN_BITS = 1
MAX_BITS = 8


def check_bits(bits: int) -> None:
    """Raise ``ValueError`` unless ``bits`` is a supported code width (1..8)."""
    if not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(
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
        raise ValueError(f"count must be non-negative, got {count}")
    return (count * bits + 7) // 8


def _bit_weights(n: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([1 << i for i in range(n)], dtype=torch.uint8, device=device)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer ``codes`` (any shape, values in ``[0, 2**bits)``) into a 1-D uint8 tensor.

    >>> pack_bits(torch.tensor([1, 2, 3]), 2)
    tensor([57], dtype=torch.uint8)
    """
    check_bits(bits)
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise TypeError(f"codes must be an integer tensor, got dtype {codes.dtype}")
    flat = codes.reshape(-1)  # [N]
    if flat.numel() > 0:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= 1 << bits:
            raise ValueError(
                f"codes must lie in [0, {1 << bits}) for bits={bits}, got range [{lo}, {hi}]"
            )
    small = flat.to(torch.uint8)  # [N]
    device = small.device
    if bits == MAX_BITS:
        return small.clone()
    if MAX_BITS % bits == 0:
        # NOTE: fast path, same format as the general one: whole codes never straddle a byte.
        per_byte = MAX_BITS // bits
        pad = (-small.numel()) % per_byte
        if pad:
            small = torch.cat([small, small.new_zeros(pad)])
        grouped = small.reshape(-1, per_byte)  # [nbytes, per_byte]
        shifts = torch.arange(0, MAX_BITS, bits, dtype=torch.uint8, device=device)
        return (grouped << shifts).sum(dim=-1, dtype=torch.int32).to(torch.uint8)
    shifts = torch.arange(bits, dtype=torch.uint8, device=device)
    stream = ((small.unsqueeze(-1) >> shifts) & 1).reshape(-1)  # [N * bits]
    pad = (-stream.numel()) % MAX_BITS
    if pad:
        stream = torch.cat([stream, stream.new_zeros(pad)])
    octets = stream.reshape(-1, MAX_BITS)  # [nbytes, 8]
    weights = _bit_weights(MAX_BITS, device)
    return (octets * weights).sum(dim=-1, dtype=torch.int32).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``count`` codes, as a 1-D uint8 tensor.

    >>> unpack_bits(torch.tensor([57], dtype=torch.uint8), 2, 3)
    tensor([1, 2, 3], dtype=torch.uint8)
    """
    check_bits(bits)
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise TypeError(
            f"packed must be a 1-D uint8 tensor, got dtype {packed.dtype} with {packed.dim()} dims"
        )
    need = packed_nbytes(count, bits)
    if packed.numel() != need:
        raise ValueError(
            f"{count} codes of {bits} bits need exactly {need} bytes, got {packed.numel()}"
        )
    device = packed.device
    if bits == MAX_BITS:
        return packed.clone()
    mask = (1 << bits) - 1
    if MAX_BITS % bits == 0:
        per_byte = MAX_BITS // bits
        shifts = torch.arange(0, MAX_BITS, bits, dtype=torch.uint8, device=device)
        spread = (packed.unsqueeze(-1) >> shifts) & mask  # [nbytes, per_byte]
        return spread.reshape(-1)[:count].clone()  # [count]
    shifts = torch.arange(MAX_BITS, dtype=torch.uint8, device=device)
    stream = ((packed.unsqueeze(-1) >> shifts) & 1).reshape(-1)  # [nbytes * 8]
    code_bits = stream[: count * bits].reshape(count, bits)  # [count, bits]
    weights = _bit_weights(bits, device)
    return (code_bits * weights).sum(dim=-1, dtype=torch.int32).to(torch.uint8)

"""Bit packing of ``b``-bit codes, as the quantizers store them.

The format and its one implementation live in the kernel layer
(:mod:`seqkv.kernels.common.bitpack`): the kernel references pack with it, and the kernels write
the same bytes. This module names it for the quantizers' users.

>>> import torch
>>> codes = torch.tensor([1, 2, 3])
>>> unpack_bits(pack_bits(codes, 2), 2, 3).tolist()
[1, 2, 3]
"""

from __future__ import annotations

from seqkv.kernels.common.bitpack import (
    MAX_BITS,
    MIN_BITS,
    check_bits,
    pack_bits,
    packed_nbytes,
    unpack_bits,
)

__all__ = ["MAX_BITS", "MIN_BITS", "check_bits", "pack_bits", "packed_nbytes", "unpack_bits"]

"""Exact coding of KV segments in their own dtype: byte planes, the top plane deflated.

Motivation: the lossy warm codings change a model's outputs (greedy decoding after a 3-bit load
leaves the recompute's tokens within a few dozen positions), and a user whose outputs must not
change had only raw storage. This coding gives back every value's bits at fewer bytes than raw.
A float's top byte holds its sign and its exponent's high bits (float32 and bfloat16: the sign
and 7 of the 8 exponent bits; float16: the sign, the 5 exponent bits and 2 mantissa bits). KV
exponents are skewed, so that plane codes to about 3 of its 8 bits; the lower bytes are mantissa
bits, close to uniform, and are stored as they are. On SmolLM2's KV
(``benchmarks/exact_layouts.py``, ``reports/exact_layouts.md``) this codes below the order-0
entropy of the top byte and of the exponent field under one table per block (deflate's tables
adapt within a block), and neither an XOR with the previous position's bits, nor the exponent
field split from the sign, nor constriction's ANS coder instead of deflate paid.

The top plane is laid out channel by channel (``[L, 2, H, D, T]``: the positions of one head
dimension adjacent, as their exponents are alike) and deflated with zlib's run-length strategy,
whose per-block Huffman tables adapt to each layer's range. The decoder depends on neither
choice: any valid zlib stream of the plane decodes.

Stored form of one segment (its length fixed by the top plane's and the geometry; the layout
is ``seqkv.formats.warm_entry.ExactPayload``'s)::

    digest       8 bytes   seqkv.digests.digest of the segment's values: little-endian,
                           [L, 2, H, T, D] order
    top length   varint    bytes of the zlib stream that follows
    top plane    zlib      the top byte of every value, [L, 2, H, D, T] order
    low planes   bytes     byte k of every value, [L, 2, H, T, D] order, for k = 0 (the least
                           significant) to width - 2, one plane after the other

Invariants:
1. ``decode(encode(kv)[0])`` holds ``kv``'s bits exactly, NaN payloads, signed zeros,
   infinities and subnormals included (checked: ``tests/test_warm_exact.py``, hypothesis).
2. A payload whose fields do not add up to its length, whose top plane does not inflate to
   exactly one byte a value, or whose decoded values do not match its digest is refused
   (``CorruptFileError``, ``DecodeVerificationError``); no KV of a refused batch is returned
   (enforced; a test each).
3. Work and memory are bounded by the payloads' size: every payload's low planes are checked to
   be present before any top plane is inflated, and inflating stops one byte past one byte a
   value (enforced: ``seqkv.formats.framing.inflate``).
4. Input is ``[segments, layers, 2, kv_heads, T, head_dim]`` in the config's dtype (enforced:
   ``InvalidKVError``); nothing is converted.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from seqkv.digests import Digest, digest
from seqkv.errors import CorruptFileError, DecodeVerificationError, InvalidKVError
from seqkv.formats.framing import inflate
from seqkv.formats.warm_entry import (
    exact_payload_side_bytes,
    read_exact_payload,
    write_exact_payload,
)
from seqkv.types import KVGeometry
from seqkv.warm.config import ExactConfig

_INTS = {2: torch.int16, 4: torch.int32}
"""Integer dtypes of each width: how a float tensor's bits are viewed."""
_UNSIGNED: dict[int, type[np.unsignedinteger[Any]]] = {2: np.uint16, 4: np.uint32}
_LEVEL = 1
_MEMORY_LEVEL = 6
"""zlib's 8-KiB symbol buffer: a Huffman table per 8,192 top bytes, about a layer's keys or
values of a 32-position block, so each adapts to that layer's exponent range."""
_WHAT = "the exact warm payload"


def _verify(index: int, segment: np.ndarray, stored: Digest) -> None:
    """Refuse a decoded segment (its values, little-endian) unless its digest is the stored one
    (invariant 2)."""
    if digest(segment.reshape(-1).data) != stored:
        raise DecodeVerificationError(
            f"{_WHAT} {index} decodes to values that do not match its digest: it is damaged, "
            "recompute the KV"
        )


class ExactCodec:
    """Codes and decodes segments of ``num_tokens`` positions of KV in ``config.dtype``.

    >>> codec = ExactCodec(ExactConfig("bfloat16"), KVGeometry(2, 2, 16), num_tokens=4)
    >>> kv = torch.randn(3, 2, 2, 2, 4, 16).to(torch.bfloat16)   # [segments, L, 2, H, T, D]
    >>> payloads, _ = codec.encode(kv)
    >>> decoded = codec.decode(payloads)
    >>> decoded.dtype, torch.equal(decoded.view(torch.int16), kv.view(torch.int16))
    (torch.bfloat16, True)
    """

    def __init__(self, config: ExactConfig, geometry: KVGeometry, num_tokens: int) -> None:
        if num_tokens < 1:
            raise InvalidKVError(f"a warm segment holds at least one position, got {num_tokens}")
        self.config = config
        self.geometry = geometry
        self.num_tokens = num_tokens
        self.dtype = config.torch_dtype
        self.width = torch.empty(0, dtype=self.dtype).element_size()
        g = geometry
        self.shape = (g.layers, 2, g.kv_heads, num_tokens, g.head_dim)
        self.values = g.layers * 2 * g.kv_heads * num_tokens * g.head_dim
        self.low_bytes = self.values * (self.width - 1)
        """Stored low-plane bytes of one segment."""

    def _check(self, kv: torch.Tensor) -> torch.Tensor:
        if kv.dim() != 6 or tuple(kv.shape[1:]) != self.shape:
            shape = ", ".join(map(str, self.shape))
            raise InvalidKVError(
                f"warm segments have shape {tuple(kv.shape)}; this codec codes "
                f"[segments, layers, 2, kv_heads, tokens, head_dim] = [n, {shape}]"
            )
        if kv.dtype != self.dtype:
            raise InvalidKVError(
                f"the KV is {kv.dtype}; this exact codec stores {self.dtype} bit for bit and "
                "converts nothing: pass the KV in the dtype the engine holds it in"
            )
        return kv.detach().to("cpu").contiguous()

    def encode(self, kv: torch.Tensor) -> tuple[list[bytes], torch.Tensor]:
        """Each segment's stored bytes, and the KV the decoder will rebuild (``kv`` itself)."""
        kv = self._check(kv)
        unsigned = _UNSIGNED[self.width]
        values = kv.view(_INTS[self.width]).numpy().view(unsigned)  # [n, L, 2, H, T, D]
        top = 8 * (self.width - 1)
        payloads = []
        for segment in values:
            channels = (segment.transpose(0, 1, 2, 4, 3) >> top).astype(np.uint8, order="C")
            deflater = zlib.compressobj(_LEVEL, zlib.DEFLATED, 15, _MEMORY_LEVEL, zlib.Z_RLE)
            coded = deflater.compress(channels.data) + deflater.flush()
            low = [(segment >> (8 * k)).astype(np.uint8).tobytes()
                   for k in range(self.width - 1)]
            little = segment.astype(f"<u{self.width}", copy=False)
            payloads.append(write_exact_payload(digest(little.reshape(-1).data), coded, low))
        return payloads, kv

    def _split(self, index: int, payload: bytes) -> tuple[Digest, bytes, bytes]:
        """A payload's digest, zlib stream and low planes, their lengths checked."""
        fields = read_exact_payload(payload, self.low_bytes, f"{_WHAT} {index}")
        return fields.digest, fields.top, fields.low

    def side_bytes(self, payload: bytes) -> int:
        """The digest's and the length's bytes of a payload (the rest are coded planes)."""
        return exact_payload_side_bytes(payload, f"{_WHAT} 0")

    def decode(self, payloads: Sequence[bytes]) -> torch.Tensor:
        """``[segments, layers, 2, kv_heads, T, head_dim]`` in ``config.dtype``."""
        if not payloads:
            raise InvalidKVError("there are no warm payloads to decode")
        parts = [self._split(i, p) for i, p in enumerate(payloads)]  # invariant 3
        unsigned = _UNSIGNED[self.width]
        top = 8 * (self.width - 1)
        layers, _, heads, tokens, dim = self.shape
        out = np.empty((len(payloads), *self.shape), dtype=unsigned)
        for index, (stored, coded, low) in enumerate(parts):
            plane = inflate(coded, self.values, f"{_WHAT} {index}'s top plane",
                            CorruptFileError)
            channels = np.frombuffer(plane, dtype=np.uint8).reshape(
                layers, 2, heads, dim, tokens)
            segment = out[index]  # [L, 2, H, T, D]
            np.left_shift(channels.transpose(0, 1, 2, 4, 3), top, out=segment, dtype=unsigned,
                          casting="unsafe")
            planes = np.frombuffer(low, dtype=np.uint8).reshape(self.width - 1, *self.shape)
            for k, byte in enumerate(planes):
                segment |= byte.astype(unsigned) << unsigned(8 * k)
            _verify(index, segment.astype(f"<u{self.width}", copy=False), stored)
        signed = out.view(np.int16 if self.width == 2 else np.int32)
        return torch.from_numpy(signed).view(self.dtype)

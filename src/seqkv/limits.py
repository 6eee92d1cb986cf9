"""The limits every reader and writer of seqkv shares, stated once.

A reader checks each field of its input against these before it allocates anything by the
field's size; what depends on the model (its context, vocabulary and layer count) the decoder
checks against the model itself (``seqkv.codec``). The limits are generous for honest files:
they refuse only what no model seqkv runs could need.

Invariants:
1. This module imports nothing (enforced by ``tests/test_layering.py``).
2. ``MAX_VARINT`` is exact in a double (``2**53 - 1``): the store's Redis scripts read varints
   as Lua numbers, and the Python reader refuses what they could not represent (enforced:
   ``seqkv.formats.framing``; both tested on shared vectors).
"""

from __future__ import annotations

# NOTE: 2**31 positions: more than any model's context, so a count beyond it is corruption
# without asking the model; the decoder then bounds it by the model's own context.
MAX_POSITIONS = 1 << 31
# The segments level's N (``seqkv.levels.segments``): more gives rows nothing to share.
MAX_SEGMENTS = 64
# Layers a file may name (the portable level's layer count; a KV's first axis): beyond any
# model seqkv runs (SmolLM2-135M: 30).
MAX_LAYERS = 1024
MAX_KV_HEADS = 1024
MAX_HEAD_DIM = 1 << 16
# (layer, K/V) groups of a residual.
MAX_GROUPS = 2 * MAX_LAYERS
# NOTE: 2**22 symbols: an arithmetic coder's frequency table is sized by the vocabulary, and
# the largest vocabularies in use are near 2**18.
MAX_VOCAB = 1 << 22
MAX_VARINT = (1 << 53) - 1
MAX_VARINT_BYTES = 8
# User-given ids and namespaces (``seqkv.namespaces``).
MAX_ID_LENGTH = 128

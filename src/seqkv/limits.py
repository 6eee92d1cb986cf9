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
# NOTE: a decode without the model (``ngram``/``plain`` tokens only, a tokens-only store) has no
# context to bound its count: at most this many tokens, the longest context of the models seqkv
# runs, unless the caller's ``max_tokens`` says otherwise (README, "Bounded decoding").
MODEL_FREE_MAX_TOKENS = 1 << 17
# NOTE: and at most this vocabulary: 2**18 = 262,144, the largest vocabularies in use (the
# format allows 2**22, for a decode that has the model, whose vocabulary the file must equal).
MODEL_FREE_MAX_VOCAB = 1 << 18
# NOTE: and at most this much work (``ModelFreeLevel.decode_work``, in units of one token an
# ``ngram`` table has seen: per token a table over the tokens seen so far at ``ngram``, one
# lookup at ``plain``): what a forged count buys when no guard or model bounds it. With
# MODEL_FREE_MAX_TOKENS it keeps the largest decode the defaults allow within the fuzz
# harness's per-case budget of 2 s of CPU (measured by ``benchmarks/model_free_decode.py``);
# at a vocabulary of 8,192 or more it allows 8,192 tokens of ``ngram`` (``table_cost``).
MAX_MODEL_FREE_WORK = 1 << 28

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
3. Every module-level bound on what an input (a file, a record, a header, a text, a name) may
   make seqkv allocate, parse or compute is defined here and imported where it is checked;
   nothing else in ``src/seqkv`` defines one (checked: ``tests/test_limits.py``).

What is not here, on purpose: constants that define what bytes mean (the arithmetic coder's
state bits, the fixed-point fractions of the integer model and the mixer, the residual code's
alphabet, the framing's one-byte section count), parameters of a coding model (the match
model's length clamp), tuning (threads, chunk rows, drafts, cache budgets) and the C kernels'
own buffer sizes (``native.c``). Changing one of those changes the bits a file holds or how fast
it is made, not what a reader accepts.
"""

from __future__ import annotations

# NOTE: 2**31 positions: more than any model's context, so a count beyond it is corruption
# without asking the model; the decoder then bounds it by the model's own context.
MAX_POSITIONS = 1 << 31
# The segments level's N (``seqkv.levels.segments``): a bound keeps a crafted or mistyped level
# from allocating N sequences' KV, and more segments give the rows nothing more to share.
MAX_SEGMENTS = 64
# A level's name where a format stores it as text (``seqkv.formats.hf_cache``): the longest is a
# family and its parameter ("segments:64", "portable+mix"); 32 bytes holds every one with room,
# and bounds what a forged length allocates.
MAX_LEVEL_BYTES = 32
# Layers a file may name (the portable level's ``portable:N``; a KV's first axis): beyond any
# model seqkv runs (SmolLM2-135M: 30); the model's own count is checked too.
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

# Sizes a coded file or its reader may reach.
# NOTE: a decode without the model (``ngram``/``plain`` tokens only, a tokens-only store) has no
# context to bound its count: at most this many tokens, the longest context of the models seqkv
# runs, unless the caller's ``max_tokens`` says otherwise (docs/guides/limits.md, "Bounded
# decoding").
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

# The JSON header of format-1 and format-2 ``.skv`` files (``seqkv.formats.skv_legacy``).
# NOTE: their writers wrote headers of about 1.4 KB, nested 3 levels deep; these bounds are
# generous for them and refuse a crafted header before it is parsed.
LEGACY_SKV_HEADER_BYTES = 64 * 1024
LEGACY_SKV_HEADER_DEPTH = 4
LEGACY_SKV_STRING = 256
LEGACY_SKV_THREADS = 4096

# A warm entry's header (``seqkv.formats.warm_entry``): its geometry fields (layers, KV heads, head
# dimension) and its token count and group size.
MAX_WARM_GEOMETRY = 1 << 20
MAX_WARM_TOKENS = 1 << 24

# The session store (``seqkv.store``).
# The most spans a chain may hold; a chain also holds at most its session's length of spans
# (each span codes at least one token after its parent's start).
MAX_CHAIN_SPANS = 1 << 16
MAX_SPAN_ID = (1 << 63) - 1
# NOTE: twice Redis's default largest value (``proto-max-bulk-len``, 512 MiB), which bounds the
# Redis backend's records: a record file past it is damage, refused before it is read.
MAX_RECORD_BYTES = 1 << 30
# Same-named sessions the connector's cold tier numbers (``name:2`` ...) before it refuses one.
MAX_SESSION_NAME_SUFFIX = 100

# Local files a user names or seqkv reads.
# NOTE: the longest file name most file systems allow (ext4, xfs, btrfs, tmpfs: 255 bytes).
MAX_NAME_BYTES = 255
# NOTE: no tokenizer seqkv runs makes tokens longer than 64 bytes on average over a text (the
# shipped sample: 4.4 bytes per token), so a text over 64 bytes per position of the model's
# context is refused before it is tokenized.
MAX_TEXT_BYTES_PER_POSITION = 64
# A description entry (``seqkv.descriptions``): flat JSON of a few hundred bytes when written.
MAX_DESCRIPTION_BYTES = 64 * 1024

"""A deterministic integer predictor: a Llama-family model whose probabilities are exact.

Float logits change with the schedule (prefill, steps, chunks, batches), the thread count and
the device, so a coder's tables built from them tie a file to one machine and one schedule.
This package evaluates the model with exact integer arithmetic for every reduction:

* ``fixedpoint``: exp2, rsqrt, sigmoid and rotary tables built with exact software arithmetic,
  evaluated with integer tensor ops;
* ``weights``: the model as int8 weight planes with per-row fixed-point scales, and its digest;
* ``blocks``: the model as its GGUF Q4_1 weight blocks with exact fixed-point block scales (the
  4-bit predictor of the ``portable4`` level), and its own digest;
* ``forward``: ``IntegerForward``, the row-invariant forward over an integer KV pool, returning
  int64 logits at ``2**-LOGIT_FRAC``;
* ``native``: the same forward's integers from C (``native.c``, one call per layer), built with
  the system compiler on first use; the torch statement in ``forward`` is its reference;
* ``table``: integer logits to the coder's cumulative frequency table with integer and
  correctly rounded float64 elementwise operations only.

>>> from seqkv.models import tiny_random_llama
>>> engine = IntegerForward(tiny_random_llama())
>>> rows = engine.forward([(engine.new_sequence(), [1, 5, 9])])[0]
>>> rows.shape, rows.dtype
((3, 512), dtype('int64'))
>>> table, log2p, entropy = integer_table(rows[-1])
>>> int(table[0]), int(table[-1])
(0, 4294967296)
"""

from seqkv.models.integer.blocks import (
    BLOCK_PREDICTOR_VERSION,
    BlockLinear,
    BlockWeights,
    block_weights,
)
from seqkv.models.integer.forward import (
    LOGIT_FRAC,
    IntegerForward,
    IntKVState,
    IntSequence,
)
from seqkv.models.integer.table import (
    cumulative_from_integer_logits,
    integer_table,
    integer_tables,
)
from seqkv.models.integer.weights import (
    PREDICTOR_VERSION,
    IntegerConfig,
    IntegerWeights,
    PredictorDigest,
    UnsupportedWeightsError,
    integer_weights,
)

__all__ = [
    "BLOCK_PREDICTOR_VERSION",
    "LOGIT_FRAC",
    "PREDICTOR_VERSION",
    "BlockLinear",
    "BlockWeights",
    "IntKVState",
    "IntSequence",
    "IntegerConfig",
    "IntegerForward",
    "IntegerWeights",
    "PredictorDigest",
    "UnsupportedWeightsError",
    "block_weights",
    "cumulative_from_integer_logits",
    "integer_table",
    "integer_tables",
    "integer_weights",
]

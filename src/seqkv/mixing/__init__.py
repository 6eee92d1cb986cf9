"""Coding tokens below the model's own cross-entropy: exact mixing with what the model cannot see.

The model codes a session at its cross-entropy and already copies well from the session itself.
This package adds the rest of the store: a content-addressed ``Dictionary`` of content that
recurs across sessions (retrieved documents, tool outputs, templates), predictors over it, and a
``MixingPredictor`` that mixes their candidates into the base model's table in exact integer
arithmetic, so encoder and decoder tables agree bit for bit on any machine, and never codes much
longer than the base alone (see ``seqkv.mixing.mixer`` for the bound).

Coder-facing use, for one session (the decoder calls the same two methods in the same order)::

    predictor = MixingPredictor(dictionary_or_index_or_None, vocab_size)
    predictor.prime(prefix_tokens)           # optional: context that is not coded
    for base_table, token in ...:            # base_table: CumulativeTable, total 2**32
        table = predictor.table(base_table)  # code ``token`` under ``table``
        predictor.update(token)

A coded file must record the dictionary's digest and the ``MixerConfig`` it was coded with; a
``DictionaryIndex`` built once per dictionary can be shared by every session's predictor.
"""

from seqkv.mixing.dictionary import (
    Dictionary,
    DictionaryDigest,
    DictionaryPolicy,
    build_dictionary,
)
from seqkv.mixing.fixedpoint import FixedPoint
from seqkv.mixing.match import DictionaryIndex
from seqkv.mixing.mixer import (
    MIXER_VERSION,
    MixerConfig,
    MixingPredictor,
    code_length_bits,
    mixed_tables,
)

__all__ = [
    "MIXER_VERSION",
    "Dictionary",
    "DictionaryDigest",
    "DictionaryIndex",
    "DictionaryPolicy",
    "FixedPoint",
    "MixerConfig",
    "MixingPredictor",
    "build_dictionary",
    "code_length_bits",
    "mixed_tables",
]

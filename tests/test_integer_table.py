"""Integer logits to coder tables: the coder's contract, batching, cost, and a coder round trip."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder
from seqkv.coding.frequencies import FREQUENCY_BITS, TOTAL_FREQUENCY
from seqkv.models import CausalLM
from seqkv.models.integer import (
    LOGIT_FRAC,
    IntegerForward,
    cumulative_from_integer_logits,
    integer_table,
    integer_tables,
)

LOGITS = hnp.arrays(np.int64, st.tuples(st.integers(1, 6), st.integers(1, 700)),
                    elements=st.integers(-(60 << LOGIT_FRAC), 60 << LOGIT_FRAC))


@given(LOGITS)
def test_tables_keep_the_coders_contract(rows: np.ndarray) -> None:
    tables, log2p, entropy = integer_tables(rows)
    assert tables.shape == (rows.shape[0], rows.shape[1] + 1)
    assert entropy.shape == (rows.shape[0],)
    assert (tables[:, 0] == 0).all() and (tables[:, -1] == TOTAL_FREQUENCY).all()
    assert (np.diff(tables, axis=1) >= 1).all()
    assert log2p.shape == rows.shape and np.isfinite(log2p).all()


@given(LOGITS)
def test_a_batch_gives_each_rows_own_table(rows: np.ndarray) -> None:
    tables, log2p, entropy = integer_tables(rows)
    for row, table, expected, expected_entropy in zip(rows, tables, log2p, entropy,
                                                      strict=True):
        single, single_log2p, single_entropy = integer_table(row)
        assert np.array_equal(single, table)
        assert np.array_equal(single_log2p, expected)
        assert single_entropy == expected_entropy  # the same bits in a batch and alone
        assert np.array_equal(cumulative_from_integer_logits(row), table)


@given(LOGITS, st.integers(-(1 << 40), 1 << 40))
def test_a_constant_shift_of_the_logits_changes_nothing(rows: np.ndarray, shift: int) -> None:
    assert np.array_equal(integer_tables(rows)[0], integer_tables(rows + shift)[0])


@given(LOGITS)
def test_log2_probabilities_match_the_exact_softmax(rows: np.ndarray) -> None:
    _, log2p, entropy = integer_tables(rows)
    shifted = rows / 2**LOGIT_FRAC
    shifted = shifted - shifted.max(-1, keepdims=True)
    exact = (shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))) / np.log(2)
    assert np.abs(log2p - exact).max() < 1.5e-6
    # the entropy from the weights' sums (invariant 4) is the exact softmax's within the same
    # 1.5e-6 bits, and agrees with the one computed from the row's log2-probabilities
    exact_entropy = -(np.exp2(exact) * exact).sum(-1)
    assert np.abs(entropy - exact_entropy).max() < 1.5e-6
    assert np.abs(entropy + (np.exp2(log2p) * log2p).sum(-1)).max() < 1.5e-6
    assert (entropy >= 0).all()


@given(LOGITS)
def test_the_table_costs_at_most_the_quantization_bound_over_ideal(rows: np.ndarray) -> None:
    """Each token within 2**-P of the top costs at most -log2(1 - V/2**32) + 1e-6 bits more than
    its ideal -log2 p; one further out costs at most the 32 bits of the floor count."""
    tables, log2p, _ = integer_tables(rows)
    vocab = rows.shape[1]
    cost = FREQUENCY_BITS - np.log2(np.diff(tables, axis=1).astype(np.float64))
    bound = -np.log2(1 - vocab / TOTAL_FREQUENCY) + 1e-6
    assert (cost <= np.maximum(-log2p + bound, FREQUENCY_BITS)).all()


def test_preconditions() -> None:
    with pytest.raises(ValueError, match="integer logits"):
        integer_table(np.zeros(5, dtype=np.float32))  # float rows are refused
    with pytest.raises(ValueError, match="1-D"):
        integer_table(np.zeros((2, 5), dtype=np.int64))
    with pytest.raises(ValueError, match="per row"):
        integer_tables(np.zeros((2, 0), dtype=np.int64))


def test_a_prefill_encodes_what_token_by_token_steps_decode(tiny_model: CausalLM) -> None:
    """The point of the predictor: the encoder runs one prefill, the decoder single steps, and
    the decoder rebuilds every table bit for bit. The code length is the tables' cost + <= 2."""
    engine = IntegerForward(tiny_model)
    tokens = [int(t) for t in np.random.default_rng(4).integers(3, 512, 40)]
    start = tiny_model.start_token_id
    assert start is not None
    rows = engine.forward([(engine.new_sequence(), [start, *tokens[:-1]])])[0]
    tables = integer_tables(rows).cumulative
    encoder = ArithmeticEncoder()
    for table, token in zip(tables, tokens, strict=True):
        encoder.encode(table, token)
    stream = encoder.finish()
    ideal = sum(FREQUENCY_BITS - np.log2(float(t[s + 1] - t[s]))
                for t, s in zip(tables, tokens, strict=True))
    assert ideal <= stream.num_bits <= ideal + 2
    decoder = ArithmeticDecoder(stream)
    sequence = engine.new_sequence()
    decoded: list[int] = []
    previous = start
    for _ in tokens:
        table = integer_table(engine.forward([(sequence, [previous])])[0][0]).cumulative
        previous = decoder.decode(table)
        decoded.append(previous)
    assert decoded == tokens


def test_the_package_docstring_runs() -> None:
    result = doctest.testmod(importlib.import_module("seqkv.models.integer"))
    assert result.attempted > 0 and result.failed == 0

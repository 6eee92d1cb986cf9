"""The shared token coder: positions in order, exact costs, and the start-token convention."""

from __future__ import annotations

import numpy as np
import pytest

from research.decoding.stream import DecodingCoder, EncodingCoder
from seqkv.models import CausalLM

ROW = np.linspace(-3.0, 3.0, 512, dtype=np.float32)


def test_round_trip_and_costs(tiny_model: CausalLM) -> None:
    encoder = EncodingCoder([9, 500, 2])
    encoder.code_first(tiny_model, None)
    # A uniform first token costs exactly log2(512) = 9 bits, float and integer alike.
    assert encoder.cross_entropy_bits == pytest.approx(9.0)
    assert encoder.ideal_code_bits == pytest.approx(9.0)
    encoder.code(1, ROW)
    encoder.code(2, ROW)
    decoder = DecodingCoder(encoder.finish(), 3)
    decoder.code_first(tiny_model, None)
    assert [decoder.code(1, ROW), decoder.code(2, ROW)] == [500, 2]
    assert decoder.tokens == encoder.tokens == [9, 500, 2]
    assert decoder.cross_entropy_bits == encoder.cross_entropy_bits
    assert decoder.ideal_code_bits == encoder.ideal_code_bits
    log2p = ROW.astype(np.float64) - np.log(np.exp(ROW.astype(np.float64)).sum())
    expected = 9.0 - (log2p[500] + log2p[2]) / np.log(2.0)
    assert encoder.cross_entropy_bits == pytest.approx(expected)


def test_positions_must_come_in_order(tiny_model: CausalLM) -> None:
    encoder = EncodingCoder([1, 2, 3])
    with pytest.raises(RuntimeError, match="schedule error"):
        encoder.code(1, ROW)


def test_no_position_past_the_count(tiny_model: CausalLM) -> None:
    encoder = EncodingCoder([1])
    encoder.code_first(tiny_model, 1)
    with pytest.raises(RuntimeError, match="schedule error"):
        encoder.code(1, ROW)

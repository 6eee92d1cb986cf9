"""The mixer under SmolLM2-135M's own tables: a quoting session round trips at under half."""

from __future__ import annotations

import pytest

from research.bench.mix import model_tables, passages, quoted_tokens
from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder
from seqkv.mixing import MixerConfig, MixingPredictor, build_dictionary, code_length_bits
from seqkv.models import CausalLM


@pytest.mark.real_model
def test_a_session_quoting_the_dictionary_round_trips_at_under_half(real_model: CausalLM) -> None:
    texts = {p.name: p.text for p in passages()}
    sample = [real_model.encode_text(f"Document 1:\n{texts['legal-0']}\n\n"
                                     f"Document 2:\n{texts['technical-0']}\n")]
    dictionary = build_dictionary(sample, real_model.vocab_size)
    session = real_model.encode_text(f"Notes on the fan:\n{texts['technical-0']}\n"
                                     f"And then:\n{texts['prose-4'][:200]}")
    assert quoted_tokens(dictionary, session) > len(session) // 2
    base = model_tables(real_model, session)
    base_tables = [base.table(i) for i in range(len(session))]
    encoder_side = MixingPredictor(dictionary, real_model.vocab_size, MixerConfig())
    encoder = ArithmeticEncoder()
    tables = []
    for table, token in zip(base_tables, session, strict=True):
        tables.append(encoder_side.table(table))
        encoder.encode(tables[-1], token)
        encoder_side.update(token)
    code = encoder.finish()
    decoder_side = MixingPredictor(dictionary, real_model.vocab_size, MixerConfig())
    decoder = ArithmeticDecoder(code)
    decoded = []
    for table in base_tables:
        decoded.append(decoder.decode(decoder_side.table(table)))
        decoder_side.update(decoded[-1])
    assert decoded == session
    mixed = code_length_bits(tables, session)
    assert code.num_bits <= mixed + 2 + 1e-6 * len(session)
    assert mixed < 0.5 * base.bits(session)


@pytest.mark.real_model
def test_text_without_dictionary_content_stays_within_the_guarantee(
        real_model: CausalLM) -> None:
    texts = {p.name: p.text for p in passages()}
    dictionary = build_dictionary([real_model.encode_text(texts["legal-0"])],
                                  real_model.vocab_size)
    session = real_model.encode_text(texts["prose-4"])
    base = model_tables(real_model, session)
    predictor = MixingPredictor(dictionary, real_model.vocab_size)
    mixed = 0.0
    for position, token in enumerate(session):
        table = predictor.table(base.table(position))
        mixed += code_length_bits([table], [token])
        predictor.update(token)
    assert mixed <= 1.001 * base.bits(session) + 16

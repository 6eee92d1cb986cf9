"""The exact mixer: decoder tables equal encoder tables, round trips, the regret bound, gains."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder
from seqkv.coding.frequencies import (
    TOTAL_FREQUENCY,
    CumulativeTable,
    cumulative_from_logits,
    table_and_log2p,
    uniform_cumulative,
)
from seqkv.errors import InvalidTensorError, InvalidTokensError
from seqkv.mixing.dictionary import Dictionary, build_dictionary
from seqkv.mixing.errors import DictionaryMismatchError, MixerConfigError
from seqkv.mixing.fixedpoint import FixedPoint
from seqkv.mixing.match import DictionaryIndex
from seqkv.mixing.mixer import MixerConfig, MixingPredictor, code_length_bits, mixed_tables
from seqkv.models import CausalLM

FIXED = FixedPoint.build()
ALL_PREDICTORS = MixerConfig(session_match=True, apm=True)


def _bits(table: CumulativeTable, token: int) -> float:
    return 32.0 - math.log2(int(table[token + 1] - table[token]))


def _base_tables(rng: np.random.Generator, vocab: int, length: int,
                 sharpness: float) -> list[CumulativeTable]:
    return [cumulative_from_logits(rng.standard_normal(vocab) * sharpness) for _ in range(length)]


def _sample(rng: np.random.Generator, table: CumulativeTable) -> int:
    return int(np.searchsorted(table, rng.integers(0, TOTAL_FREQUENCY), side="right") - 1)


def _decode(dictionary: Dictionary | None, vocab: int, config: MixerConfig,
            base_tables: list[CumulativeTable], code: ArithmeticEncoder
            ) -> tuple[list[int], list[CumulativeTable]]:
    """The decoder's side: one table at a time, each token decoded before the next table."""
    predictor = MixingPredictor(dictionary, vocab, config, FIXED)
    decoder = ArithmeticDecoder(code.finish())
    tokens, tables = [], []
    for base in base_tables:
        table = predictor.table(base)
        token = decoder.decode(table)
        predictor.update(token)
        tokens.append(token)
        tables.append(table)
    return tokens, tables


def _check_round_trip(dictionary: Dictionary | None, vocab: int, config: MixerConfig,
                      base_tables: list[CumulativeTable], tokens: list[int]) -> float:
    encoder_side = MixingPredictor(dictionary, vocab, config, FIXED)
    tables = list(mixed_tables(encoder_side, base_tables, tokens))
    encoder = ArithmeticEncoder()
    for table, token in zip(tables, tokens, strict=True):
        assert table.shape == (vocab + 1,) and table[0] == 0 and table[-1] == TOTAL_FREQUENCY
        assert int(np.diff(table).min()) >= 1
        encoder.encode(table, token)
    decoded, decoder_tables = _decode(dictionary, vocab, config, base_tables, encoder)
    assert decoded == tokens
    assert all(np.array_equal(a, b) for a, b in zip(tables, decoder_tables, strict=True))
    ideal = code_length_bits(tables, tokens)
    assert encoder.finish().num_bits <= ideal + 2 + 1e-6 * len(tokens)
    return ideal


def _quoting_session(rng: np.random.Generator, vocab: int, base_tables: list[CumulativeTable],
                     passage: list[int]) -> list[int]:
    """Tokens drawn from the base, with the passage quoted in the middle."""
    tokens = [_sample(rng, table) for table in base_tables]
    start = len(tokens) // 3
    end = min(len(tokens), start + len(passage))
    tokens[start:end] = passage[: end - start]
    return tokens


@given(st.integers(8, 300), st.integers(1, 80), st.integers(0, 2**32 - 1),
       st.sampled_from([0.3, 2.0, 8.0]))
def test_decoder_tables_equal_encoder_tables_and_the_code_round_trips(
        vocab: int, length: int, seed: int, sharpness: float) -> None:
    rng = np.random.default_rng(seed)
    passage = rng.integers(0, vocab, 40).tolist()
    dictionary = build_dictionary([rng.integers(0, vocab, 30).tolist() + passage], vocab)
    base_tables = _base_tables(rng, vocab, length, sharpness)
    tokens = _quoting_session(rng, vocab, base_tables, passage)
    _check_round_trip(dictionary, vocab, ALL_PREDICTORS, base_tables, tokens)


def test_round_trip_under_a_real_models_tables(tiny_model: CausalLM) -> None:
    rng = np.random.default_rng(1)
    vocab = tiny_model.vocab_size
    passage = rng.integers(3, vocab, 60).tolist()
    prefix = rng.integers(3, vocab, 40).tolist()
    tokens = prefix + passage + prefix[:20]
    dictionary = build_dictionary([rng.integers(3, vocab, 50).tolist() + passage], vocab)
    with torch.inference_mode():
        ids = torch.tensor([[tiny_model.start_token_id or 0, *tokens[:-1]]])  # [1, T]
        logits = tiny_model.model(input_ids=ids).logits[0].float().numpy()  # [T, V]
    base_tables = [table_and_log2p(row)[0] for row in logits]
    base = sum(_bits(t, x) for t, x in zip(base_tables, tokens, strict=True))
    for config in (MixerConfig(), ALL_PREDICTORS, MixerConfig(dictionary_ngram=False)):
        mixed = _check_round_trip(dictionary, vocab, config, base_tables, tokens)
        assert mixed < 0.7 * base  # the quoted 60 of 120 tokens become almost free


def _regret_allowance(base_bits: float, tables: list[CumulativeTable], tokens: list[int],
                      vocab: int) -> float:
    """The module's bound: 1 bit of prior, the share ledger, and each token's floor rounding."""
    rounding = 0.0
    for table, token in zip(tables, tokens, strict=True):
        count = int(table[token + 1] - table[token])
        rounding += math.log2(1 + 1 / max(1, count - vocab))
    return 1 + 8 + 0.0005 * base_bits + rounding


@st.composite
def adversarial_cases(draw: st.DrawFn) -> tuple[int, list[CumulativeTable], list[int], Dictionary]:
    vocab = draw(st.integers(4, 200))
    length = draw(st.integers(1, 150))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sharpness = draw(st.sampled_from([0.5, 3.0, 12.0]))
    base_tables = _base_tables(rng, vocab, length, sharpness)
    tokens = [_sample(rng, t) if rng.random() < 0.7 else int(rng.integers(0, vocab))
              for t in base_tables]
    kind = draw(st.sampled_from(["liar", "random", "copy"]))
    if kind == "liar":  # the session's contexts, each followed by another token
        sample = [t if i % 4 else (t + 1) % vocab for i, t in enumerate(tokens)]
    elif kind == "random":
        sample = rng.integers(0, vocab, 200).tolist()
    else:
        sample = list(tokens)
    dictionary = build_dictionary([sample or [0]], vocab)
    return vocab, base_tables, tokens, dictionary


@given(adversarial_cases())
def test_the_mixer_never_exceeds_the_stated_regret_bound(
        case: tuple[int, list[CumulativeTable], list[int], Dictionary]) -> None:
    vocab, base_tables, tokens, dictionary = case
    base = sum(_bits(t, x) for t, x in zip(base_tables, tokens, strict=True))
    for config in (MixerConfig(), ALL_PREDICTORS):
        predictor = MixingPredictor(dictionary, vocab, config, FIXED)
        tables = list(mixed_tables(predictor, base_tables, tokens))
        mixed = code_length_bits(tables, tokens)
        assert mixed <= base + _regret_allowance(base, tables, tokens, vocab) + 1e-9


@settings(max_examples=4)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["liar", "random"]))
def test_useless_dictionaries_cost_at_most_a_thousandth_and_16_bits(seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    vocab, length = 512, 3000
    # A real model's entropy profile: mostly confident, sometimes lost.
    base_tables = [cumulative_from_logits(rng.standard_normal(vocab) * rng.choice([1.0, 4.0, 9.0]))
                   for _ in range(length)]
    tokens = [_sample(rng, t) for t in base_tables]
    if kind == "liar":
        sample = [t if i % 3 else (t + 7) % vocab for i, t in enumerate(tokens)]
    else:
        sample = rng.integers(0, vocab, 5000).tolist()
    dictionary = build_dictionary([sample], vocab)
    base = sum(_bits(t, x) for t, x in zip(base_tables, tokens, strict=True))
    for config in (MixerConfig(), ALL_PREDICTORS):
        predictor = MixingPredictor(dictionary, vocab, config, FIXED)
        mixed = code_length_bits(mixed_tables(predictor, base_tables, tokens), tokens)
        assert mixed <= 1.001 * base + 16


def test_a_quoted_dictionary_passage_costs_a_fraction_of_the_base() -> None:
    rng = np.random.default_rng(5)
    vocab = 4096
    passages = [rng.integers(0, vocab, 150).tolist() for _ in range(3)]
    dictionary = build_dictionary([passages[0] + passages[1], passages[2]], vocab)
    session = passages[1] + passages[2]
    base_tables = _base_tables(rng, vocab, len(session), 1.0)  # ~11 bits per token
    base = sum(_bits(t, x) for t, x in zip(base_tables, session, strict=True))
    predictor = MixingPredictor(dictionary, vocab, MixerConfig(), FIXED)
    mixed = code_length_bits(mixed_tables(predictor, base_tables, session), session)
    assert mixed < 0.1 * base


def test_a_vocabulary_of_candidates_only() -> None:
    rng = np.random.default_rng(6)
    tokens = rng.integers(0, 2, 200).tolist()
    dictionary = build_dictionary([tokens[::-1]], 2)
    base_tables = _base_tables(rng, 2, len(tokens), 1.0)
    _check_round_trip(dictionary, 2, ALL_PREDICTORS, base_tables, tokens)


def test_without_predictions_the_base_table_passes_through() -> None:
    predictor = MixingPredictor(None, 16, MixerConfig(), FIXED)
    rng = np.random.default_rng(0)
    for table in _base_tables(rng, 16, 20, 3.0):
        assert predictor.table(table) is table
        predictor.update(int(rng.integers(0, 16)))


def test_a_shared_index_gives_the_same_tables_as_private_ones() -> None:
    rng = np.random.default_rng(2)
    vocab = 64
    passage = rng.integers(0, vocab, 50).tolist()
    dictionary = build_dictionary([passage], vocab)
    base_tables = _base_tables(rng, vocab, 80, 2.0)
    tokens = _quoting_session(rng, vocab, base_tables, passage)
    shared = DictionaryIndex(dictionary, MixerConfig().min_match)
    first = list(mixed_tables(MixingPredictor(shared, vocab), base_tables, tokens))
    second = list(mixed_tables(MixingPredictor(shared, vocab), base_tables, tokens))
    private = list(mixed_tables(MixingPredictor(dictionary, vocab), base_tables, tokens))
    assert all(np.array_equal(a, b) and np.array_equal(a, c)
               for a, b, c in zip(first, second, private, strict=True))


def test_primed_context_reaches_the_dictionary_at_the_first_token() -> None:
    rng = np.random.default_rng(4)
    vocab = 512
    passage = rng.integers(0, vocab, 80).tolist()
    dictionary = build_dictionary([passage], vocab)
    base = uniform_cumulative(vocab)
    primed = MixingPredictor(dictionary, vocab)
    primed.prime(passage[:40])
    cold = MixingPredictor(dictionary, vocab)
    assert primed.history == passage[:40]
    assert _bits(primed.table(base), passage[40]) < _bits(cold.table(base), passage[40])


def _bad_table(vocab: int) -> npt.NDArray[np.int64]:
    table = uniform_cumulative(vocab).copy()
    table[2] = table[1]  # token 1 gets a count of 0
    return table


def test_a_table_of_the_wrong_size() -> None:
    with pytest.raises(InvalidTensorError):
        MixingPredictor(None, 16).table(uniform_cumulative(17))


def test_a_table_with_a_zero_count() -> None:
    with pytest.raises(InvalidTensorError):
        MixingPredictor(None, 16).table(_bad_table(16))


def test_a_token_outside_the_vocabulary() -> None:
    with pytest.raises(InvalidTokensError):
        MixingPredictor(None, 16).update(16)


def test_a_primed_token_outside_the_vocabulary() -> None:
    with pytest.raises(InvalidTokensError):
        MixingPredictor(None, 16).prime([3, -1])


def test_a_dictionary_for_another_vocabulary() -> None:
    with pytest.raises(DictionaryMismatchError):
        MixingPredictor(Dictionary([1, 2, 3], [3], 32), 16)


def test_an_index_with_other_windows_than_the_config() -> None:
    index = DictionaryIndex(Dictionary([1, 2, 3], [3], 16), min_length=5)
    with pytest.raises(MixerConfigError):
        MixingPredictor(index, 16, MixerConfig(min_match=3))


def test_a_share_rate_without_a_ledger_cost() -> None:
    with pytest.raises(MixerConfigError):
        MixerConfig(share_shift=20)


def test_the_fingerprint_names_every_setting_and_tells_configs_apart() -> None:
    assert MixerConfig().fingerprint() == (
        "mixer1;dictionary_match=1;dictionary_ngram=1;session_match=0;apm=0;min_match=3;"
        "session_min_match=3;learning_rate=16;apm_rate_shift=6;share_shift=12;"
        "initial_weights=16384,65536,16384,32768,0")
    assert MixerConfig(apm=True).fingerprint() != MixerConfig().fingerprint()

"""The rate-compute dial: every level round-trips exactly; levels, batches and bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from seqkv.coding.frequencies import TOTAL_FREQUENCY, cumulative_from_counts
from seqkv.coding.ngram import AdaptiveNgram
from seqkv.descriptions import Descriptions
from seqkv.digests import profile_digest
from seqkv.errors import (
    CorruptFileError,
    EnvironmentMismatchError,
    InvalidLevelError,
    KVNotRecordedError,
    UnsupportedVersionError,
)
from seqkv.formats.skv import read_skv, write_skv
from seqkv.kvcache import tensor_from_cache
from seqkv.levels import LEVELS as REGISTRY
from seqkv.levels import (
    PlainLevel,
    SegmentsLevel,
    TokensLevel,
    family,
    parse_level,
    segment_order,
    split_lengths,
)
from seqkv.models import CausalLM
from seqkv.schedule import pinned_threads, schedule_threads
from seqkv.skv import compress, decompress, decompress_batch, decompress_tokens

LEGACY = Path(__file__).parent / "data" / "legacy"

VOCAB = 512
LEVELS = ["tokens", "rows", "segments:2", "segments:5", "ngram", "plain"]
token_lists = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)


@given(tokens=token_lists, level=st.sampled_from(LEVELS),
       tolerance=st.sampled_from([0.0, 1e-4]))
def test_every_level_round_trips_tokens_and_kv(tiny_model: CausalLM, tokens: list[int],
                                               level: str, tolerance: float) -> None:
    kv = tiny_model.prefill(tokens)
    result = compress(tiny_model, tokens, kv, tolerance=tolerance, level=level)
    decoded = decompress(tiny_model, result.data)
    assert decoded.tokens == tokens
    assert (decoded.kv - tensor_from_cache(kv)).abs().max().item() <= tolerance
    assert decoded.session.level == parse_level(level).spec.name
    assert np.array_equal(decoded.trace.surprisal_bits, result.trace.surprisal_bits)
    assert result.stats.code_bits <= result.stats.cross_entropy_bits + 2 + 2e-5 * len(tokens)


def test_rows_level_codes_the_same_distributions_as_tokens_level(tiny_model: CausalLM) -> None:
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, VOCAB, 40)]
    by_tokens = compress(tiny_model, tokens, level="tokens").trace.surprisal_bits
    by_rows = compress(tiny_model, tokens, level="rows").trace.surprisal_bits
    # Two forwards of the same model: equal up to float noise, not necessarily bit for bit.
    assert np.abs(by_tokens - by_rows).max() < 1e-3


@pytest.mark.parametrize("level", ["segments:2", "segments:4"])
def test_segments_of_repetitive_text_decode_in_code_order(tiny_model: CausalLM,
                                                          level: str) -> None:
    """Prompt lookup guesses right on repeated text; a segment must still not decode ahead of
    its siblings, whose symbols interleave with its own in the one arithmetic code."""
    tokens = [5, 6, 7, 8, 9, 10] * 12
    decoded = decompress(tiny_model, compress(tiny_model, tokens, level=level).data)
    assert decoded.tokens == tokens


def test_segments_cost_more_bits_than_one_sequence(tiny_model: CausalLM) -> None:
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, 40, 60)] * 2
    rows = compress(tiny_model, tokens, level="rows").stats.cross_entropy_bits
    segments = compress(tiny_model, tokens, level="segments:6").stats.cross_entropy_bits
    assert rows != segments


@given(tokens=token_lists, level=st.sampled_from(["ngram", "plain"]))
def test_portable_levels_decode_without_a_model(tiny_model: CausalLM, tokens: list[int],
                                                level: str) -> None:
    data = compress(tiny_model, tokens, level=level).data
    assert decompress_tokens(data) == tokens


def test_plain_level_costs_log2_vocab_per_token(tiny_model: CausalLM) -> None:
    tokens = list(range(100))
    stats = compress(tiny_model, tokens, level="plain").stats
    assert stats.bits_per_token == pytest.approx(np.log2(VOCAB), abs=0.05)


def test_ngram_level_learns_repetition(tiny_model: CausalLM) -> None:
    tokens = [5, 9, 77, 300, 41] * 30
    stats = compress(tiny_model, tokens, level="ngram").stats
    assert stats.bits_per_token < 2.0


def test_model_coded_tokens_need_the_model(tiny_model: CausalLM) -> None:
    data = compress(tiny_model, [1, 2, 3], level="rows").data
    with pytest.raises(EnvironmentMismatchError, match="pass the model"):
        decompress_tokens(data)
    assert decompress_tokens(data, tiny_model) == [1, 2, 3]


def test_a_portable_tokens_decode_runs_no_float_forward(tiny_model: CausalLM,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``decompress_tokens`` of a portable file decodes with the integer predictor alone: no
    float prefill rebuilds a KV that nobody asked for (it cost a third of a 200-token decode and
    stalled beside a competing process)."""
    tokens = [int(t) for t in range(3, 120, 5)]
    data = compress(tiny_model, tokens, level="portable").data

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a float forward ran during a tokens-only decode")

    monkeypatch.setattr(tiny_model.model, "forward", refused)
    assert decompress_tokens(data, tiny_model) == tokens
    with pytest.raises(AssertionError, match="float forward"):
        decompress(tiny_model, data)  # the KV rebuild does run one


@given(sessions=st.lists(token_lists, min_size=1, max_size=5),
       levels=st.lists(st.sampled_from(LEVELS), min_size=5, max_size=5))
def test_batched_decoding_equals_one_by_one(tiny_model: CausalLM, sessions: list[list[int]],
                                            levels: list[str]) -> None:
    files = [compress(tiny_model, tokens, tiny_model.prefill(tokens), level=level)
             for tokens, level in zip(sessions, levels, strict=False)]
    batched = decompress_batch(tiny_model, [f.data for f in files])
    for result, file, tokens in zip(batched, files, sessions, strict=True):
        alone = decompress(tiny_model, file.data)
        assert result.tokens == alone.tokens == tokens
        assert torch.equal(result.kv, alone.kv)


def test_split_lengths_and_order() -> None:
    assert split_lengths(10, 3) == [4, 3, 3]
    assert split_lengths(2, 5) == [1, 1]
    assert list(segment_order([2, 1])) == [(0, 0), (1, 0), (0, 1)]


@pytest.mark.parametrize("text, expected", [
    ("tokens", TokensLevel()),
    ("segments:16", SegmentsLevel(16)),
    ("plain", PlainLevel()),
])
def test_level_names_parse(text: str, expected: object) -> None:
    assert parse_level(text) == expected
    assert parse_level(parse_level(text).spec.name) == expected


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_level_names_itself(name: str) -> None:
    level = parse_level("segments:3" if name == "segments" else name)
    assert parse_level(level.spec.name) == level and family(level) == name


@pytest.mark.parametrize("text", ["fast", "segments", "segments:1", "segments:x", "rows:4",
                                  "segments:65", "segments:-2"])
def test_bad_level_names_are_refused(text: str) -> None:
    with pytest.raises(InvalidLevelError, match=r"level|segments"):
        parse_level(text)


def _legacy_with(name: str, **token_fields: object) -> bytes:
    """A format-2 file of tests/data/legacy with fields of its JSON header changed."""
    data = (LEGACY / name).read_bytes()
    prefix = struct.Struct("<8sHHIQQQ")
    magic, version, reserved, header_len, *lengths = prefix.unpack_from(data)
    header = json.loads(data[prefix.size : prefix.size + header_len])
    header["tokens"].update(token_fields)
    raw = json.dumps(header, sort_keys=True).encode()
    body = (prefix.pack(magic, version, reserved, len(raw), *lengths) + raw
            + data[prefix.size + header_len : -32])
    return body + hashlib.sha256(body).digest()


def test_unknown_level_is_refused_by_name(tiny_model: CausalLM) -> None:
    with pytest.raises(UnsupportedVersionError, match="quantum"):
        decompress(tiny_model, _legacy_with("v2-tokens.skv", level="quantum"))


def test_segment_lengths_that_do_not_add_up_are_corruption(tiny_model: CausalLM) -> None:
    with pytest.raises(CorruptFileError, match="segments add up"):
        decompress(tiny_model, _legacy_with("v2-segments-3.skv", segments=[2, 1]))


def test_portable_levels_decode_under_another_profile_with_an_inexact_kv(
        tiny_model: CausalLM, tmp_path: Path) -> None:
    result = compress(tiny_model, [1, 2, 3], level="ngram")
    profile = dataclasses.replace(result.profile, device_class="cuda:NVIDIA H200")
    descriptions = Descriptions(tmp_path)
    descriptions.remember(profile=profile)
    session = read_skv(result.data).session
    moved = write_skv(dataclasses.replace(session, profile_digest=profile_digest(profile))).data
    decoded = decompress(tiny_model, moved, descriptions=descriptions)
    assert decoded.tokens == [1, 2, 3] and not decoded.kv_exact
    assert decoded.stats.tokens_verified and not decoded.stats.kv_verified
    with pytest.raises(EnvironmentMismatchError, match="device_class"):
        decompress(tiny_model, moved, descriptions=descriptions, require_exact_kv=True)
    assert decompress_tokens(moved) == [1, 2, 3]


@pytest.mark.parametrize("level", ["ngram", "plain"])
def test_model_free_levels_rebuild_the_kv_of_the_callers_prefill(tiny_model: CausalLM,
                                                                 level: str) -> None:
    """The ``prefill`` schedule: the KV a decoder rebuilds is, bit for bit, the one prefill a
    caller computes (so the residual codes nothing), and longer than a row-forward chunk."""
    tokens = [int(t) for t in np.random.default_rng(11).integers(0, VOCAB, 300)]
    with pinned_threads(1):  # the caller's own setting: the prefill keeps its schedule's
        kv = tensor_from_cache(tiny_model.prefill(tokens))
    result = compress(tiny_model, tokens, kv, level=level)
    assert result.profile.schedule == "prefill" and result.stats.max_abs_kv_error == 0.0
    decoded = decompress(tiny_model, result.data)
    assert decoded.tokens == tokens and decoded.kv_exact and decoded.kv.equal(kv)


def test_a_prefill_runs_on_the_prefill_schedules_threads(tiny_model: CausalLM,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the caller's thread count, so that a KV rebuilt by one prefill is the caller's
    bit for bit on any machine (mutant: no pinning -> the caller's 1 thread)."""
    seen: list[int] = []
    forward = tiny_model.model.forward

    def counting(*args: object, **kwargs: object) -> object:
        seen.append(torch.get_num_threads())
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_model.model, "forward", counting)
    with pinned_threads(schedule_threads("prefill") + 1):
        tiny_model.prefill([1, 2, 3])
    assert seen == [schedule_threads("prefill")]


@pytest.mark.parametrize("level", ["ngram", "plain"])
def test_model_free_files_of_earlier_releases_rebuild_their_kv_on_the_rows_schedule(
        tiny_model: CausalLM, level: str, monkeypatch: pytest.MonkeyPatch,
        as_earlier_release: Callable[[str], None]) -> None:
    """Earlier releases computed these levels' KV with the row-invariant forward; their files
    name that schedule through their profile digest, and a decoder on the same machine rebuilds
    it bit for bit (mutant: ``kv_schedule`` always the level's own schedule -> the KV is the
    prefill's, reported inexact)."""
    tokens = [int(t) for t in np.random.default_rng(12).integers(0, VOCAB, 300)]
    kv = tensor_from_cache(tiny_model.prefill(tokens))
    as_earlier_release(level)
    former = compress(tiny_model, tokens, kv, level=level)
    monkeypatch.undo()
    assert former.profile.schedule == "rows" and former.profile.row_block > 0
    current = compress(tiny_model, tokens, kv, level=level)
    assert current.session.profile_digest != former.session.profile_digest
    decoded = decompress(tiny_model, former.data, require_exact_kv=True)
    assert decoded.tokens == tokens and decoded.kv_exact and decoded.stats.kv_verified
    assert decoded.kv.equal(former.kv) and not decoded.kv.equal(current.kv)


def test_a_portable_text_longer_than_an_encoder_chunk_round_trips(tiny_model: CausalLM) -> None:
    """The encoder reuses its logits and table buffers from chunk to chunk (300 tokens: five
    batches of 64 tables, two forwards of 256 rows); every token still decodes."""
    tokens = [int(t) for t in np.random.default_rng(8).integers(0, 512, 300)]
    result = compress(tiny_model, tokens, level="portable")
    assert decompress(tiny_model, result.data).tokens == tokens


def test_a_portable_file_coded_without_its_kv_decodes_exact_tokens_and_an_unverified_kv(
        tiny_model: CausalLM) -> None:
    tokens = [5, 17, 17, 3, 99, 5, 17]
    result = compress(tiny_model, tokens, level="portable")
    assert result.kv is None and result.session.kv_digest is None
    decoded = decompress(tiny_model, result.data)
    assert decoded.tokens == tokens and not decoded.kv_exact
    assert decoded.stats.tokens_verified and not decoded.stats.kv_verified
    # the recomputed KV is the prefill schedule's, as a file with its KV recorded holds
    recorded = compress(tiny_model, tokens, level="portable", record_kv=True)
    assert recorded.kv is not None and decoded.kv.equal(recorded.kv)
    assert decompress(tiny_model, recorded.data).kv_exact
    with pytest.raises(KVNotRecordedError, match="records no KV"):
        decompress(tiny_model, result.data, require_exact_kv=True)


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=300))
def test_count_tables_sum_exactly_and_keep_every_symbol(counts: list[int]) -> None:
    if sum(counts) == 0:
        counts[0] = 1
    table = cumulative_from_counts(np.array(counts))
    assert table[0] == 0 and table[-1] == TOTAL_FREQUENCY
    assert np.all(np.diff(table) >= 1)


def test_ngram_tables_depend_only_on_the_history() -> None:
    a, b = AdaptiveNgram(50), AdaptiveNgram(50)
    for token in [3, 4, 3, 4, 3]:
        a.update(token)
        b.update(token)
    assert np.array_equal(a.distribution()[0], b.distribution()[0])
    assert a.weights()[4] > a.weights()[5]


@pytest.mark.real_model
def test_real_model_fast_levels_round_trip_and_batch(real_model: CausalLM) -> None:
    text = ("The keeper climbed the tower at dusk, trimmed the wick, and lit the lamp. "
            "Then he wrote the hour in the log, as he had every night for twenty years.")
    tokens = real_model.encode_text(text)
    kv = real_model.prefill(tokens)
    files = [compress(real_model, tokens, kv, level=level) for level in ("rows", "segments:4")]
    assert files[0].stats.bits_per_token < files[1].stats.bits_per_token
    shifted = tokens[5:] + tokens[:5]
    files.append(compress(real_model, shifted, real_model.prefill(shifted), level="rows"))
    decoded = decompress_batch(real_model, [f.data for f in files])
    assert [d.tokens for d in decoded] == [tokens, tokens, shifted]
    assert (decoded[0].kv - tensor_from_cache(kv)).abs().max().item() <= 1e-4


def test_portable_encode_buffers_are_lent_to_one_encode_at_a_time() -> None:
    """Encodes running at once get distinct buffers; a returned set is reused; no more than
    KEPT_BUFFER_SETS are kept."""
    from seqkv.levels import portable

    pool = portable._BufferPool(vocab=7)
    with pool.lend() as first, pool.lend() as second, pool.lend() as third:
        assert len({id(first), id(second), id(third)}) == 3
        assert first.logits.shape == (portable.ENCODE_CHUNK_ROWS, 7)
    assert len(pool._free) == portable.KEPT_BUFFER_SETS
    with pool.lend() as again:
        assert again is second  # the last set returned (third, then second), not a fresh one

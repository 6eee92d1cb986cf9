"""Both speculative prototypes on the embedded SmolLM2-135M: exact on ~96 tokens of real text."""

from __future__ import annotations

import importlib.resources

import pytest

from research.decoding import (
    Fallback,
    JacobiDraft,
    NoDraft,
    PromptLookup,
    blocked_decode,
    blocked_encode,
    speculative_decode,
    speculative_encode,
)
from research.decoding.probes import later_token_independence
from seqkv.kvcache import tensor_from_cache
from seqkv.models import CausalLM

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def tokens(real_model: CausalLM) -> list[int]:
    text = (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8")
    return real_model.encode_text(text)[:96]


def test_replayed_speculation_round_trip(real_model: CausalLM, tokens: list[int]) -> None:
    # A passage quoted again later: what prompt lookup is for. NOTE: bigram lookup drafts
    # rarely on fresh prose, which keeps this test short; the tiny-model tests cover Jacobi
    # guesses and long drafts.
    quoted = tokens[:64] + tokens[8:40]
    policy = PromptLookup(min_ngram=2, max_draft=4)
    coded = speculative_encode(real_model, quoted, policy)
    decoded = speculative_decode(real_model, coded, policy)
    assert decoded.tokens == quoted
    assert tensor_from_cache(decoded.cache).equal(tensor_from_cache(coded.cache))
    assert coded.code.num_bits <= coded.cross_entropy_bits + 2 + 2e-5 * len(quoted)
    assert coded.stats.accepted > 16 and coded.stats.forwards < len(quoted) - 16


def test_blocked_round_trip(real_model: CausalLM, tokens: list[int]) -> None:
    coded = blocked_encode(real_model, tokens, blocks=8)
    decoded = blocked_decode(real_model, coded, Fallback(PromptLookup(), JacobiDraft()))
    assert decoded.tokens == tokens
    assert tensor_from_cache(decoded.cache).equal(tensor_from_cache(coded.cache))
    assert coded.code.num_bits <= coded.cross_entropy_bits + 2 + 2e-5 * len(tokens)
    # Rows on another schedule cost the same bits up to rounding of the logits.
    replay = speculative_encode(real_model, tokens[:32], NoDraft())
    prefix = blocked_encode(real_model, tokens[:32], blocks=16)
    assert abs(replay.cross_entropy_bits - prefix.cross_entropy_bits) < 1e-2


def test_later_tokens_do_not_change_a_row(real_model: CausalLM, tokens: list[int]) -> None:
    assert later_token_independence(real_model, tokens, 16, seed=1).bit_identical

"""A verified compress runs no float forward whose result another already gave
(``seqkv.codec`` invariant 7): the caller's prefill is the level's KV and the reference bound's
rows (``kv="prefill"``), the start token is forwarded once for every segment, and the verifying
decode still rebuilds the KV on its own. The file is the one the former path wrote, byte for
byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

import seqkv.codec as codec
import seqkv.levels.portable as portable
from seqkv.bounds import reference_surprisal, shared_prefill
from seqkv.cli.sessions import _compress_and_verify
from seqkv.codec import encode
from seqkv.errors import InvalidArgumentTypeError
from seqkv.levels import parse_level
from seqkv.models import CausalLM
from seqkv.session import Prefix
from seqkv.skv import compress

TOKENS = [5, 17, 17, 3, 99, 100, 7, 8, 9, 10, 11, 12, 400, 401, 402, 7, 8, 9]


@contextmanager
def _forwards(model: CausalLM) -> Iterator[list[int]]:
    """The input length of every float forward of ``model`` run inside the block."""
    lengths: list[int] = []

    def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        assert isinstance(ids, torch.Tensor)
        lengths.append(int(ids.shape[1]))

    handle = model.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield lengths
    finally:
        handle.remove()


def _verified_compress_forwards(model: CausalLM, tokens: list[int], kv_mode: str = "prefill",
                                level: str = "portable") -> list[int]:
    """The float forwards of ``seqkv compress`` (verified) on ``tokens``."""
    with _forwards(model) as lengths:
        _, figures = _compress_and_verify(model, tokens, kv_mode, 1e-4, True, parse_level(level))
    assert figures["verified"]
    return lengths


def _assert_three_forwards(model: CausalLM, tokens: list[int], kv_mode: str = "prefill"
                           ) -> None:
    # the shared prefill (the caller's KV, the level's, the reference's rows), the start token
    # alone (the reference's first row), the verifying decode's own prefill
    expected = [len(tokens), 1, len(tokens)] if model.start_token_id is not None else [
        len(tokens), len(tokens)]
    assert _verified_compress_forwards(model, tokens, kv_mode) == expected


def test_a_verified_portable_compress_runs_three_float_forwards(tiny_model: CausalLM) -> None:
    _assert_three_forwards(tiny_model, TOKENS)
    _assert_three_forwards(tiny_model, TOKENS, kv_mode="none")  # the reference's, not shared


def test_the_count_fails_when_the_level_prefills_again(
        tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a portable level that ignores the codec's prefill runs a fourth forward."""
    prefill_kv = portable.prefill_kv
    monkeypatch.setattr(portable, "prefill_kv",
                        lambda model, tail, prefix, prefilled=None: prefill_kv(model, tail,
                                                                               prefix))
    with pytest.raises(AssertionError):
        _assert_three_forwards(tiny_model, TOKENS)


def test_the_count_fails_when_the_reference_runs_its_own_prefill(
        tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a reference that does not read the shared prefill's rows."""
    def unshared(*args: Any, **kwargs: Any) -> np.ndarray[Any, Any]:
        kwargs.pop("prefilled", None)
        return reference_surprisal(*args, **kwargs)

    monkeypatch.setattr(codec, "reference_surprisal", unshared)
    with pytest.raises(AssertionError):
        _assert_three_forwards(tiny_model, TOKENS)


def _same_files(model: CausalLM, tokens: list[int], level: str) -> None:
    shared = compress(model, tokens, kv="prefill", level=level)
    caller = compress(model, tokens, kv=model.prefill(tokens), level=level)
    assert shared.data == caller.data
    assert [(b.name, b.holds) for b in shared.bounds] == [(b.name, b.holds)
                                                          for b in caller.bounds]
    assert shared.kv is not None and caller.kv is not None
    assert torch.equal(shared.kv, caller.kv)


@pytest.mark.parametrize("level", ["portable", "ngram", "plain", "tokens", "rows", "segments:3"])
def test_kv_prefill_writes_the_file_of_the_callers_prefill(tiny_model: CausalLM,
                                                           level: str) -> None:
    _same_files(tiny_model, TOKENS, level)


def test_the_file_comparison_catches_a_prefill_that_is_not_the_callers(
        tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a shared prefill whose KV differs from ``CausalLM.prefill``'s in one ulp."""
    def off(model: CausalLM, tokens: Sequence[int], with_surprisal: bool) -> Any:
        found = shared_prefill(model, tokens, with_surprisal)
        kv = found.kv.clone()
        kv[0, 0, 0, 0, 0] = torch.nextafter(kv[0, 0, 0, 0, 0], torch.tensor(np.inf))
        return type(found)(kv, found.surprisal)

    monkeypatch.setattr(codec, "shared_prefill", off)
    with pytest.raises(AssertionError):
        _same_files(tiny_model, TOKENS, "portable")


@pytest.mark.parametrize("level", ["portable", "tokens"])
def test_kv_prefill_after_a_prefix_codes_the_callers_session(tiny_model: CausalLM,
                                                             level: str) -> None:
    """After a prefix the level continues the prefix's KV (its own forward); the caller's
    prefill is still the residual's target and the reference's rows."""
    prefix = Prefix(tuple(TOKENS[:7]), tiny_model.kv_tensor(tiny_model.prefill(TOKENS[:7])))
    shared = encode(tiny_model, TOKENS, "prefill", prefix=prefix, level=level)
    caller = encode(tiny_model, TOKENS, tiny_model.prefill(TOKENS), prefix=prefix, level=level)
    assert shared.session == caller.session
    assert [(b.name, b.holds) for b in shared.bounds] == [(b.name, b.holds)
                                                          for b in caller.bounds]


@pytest.mark.parametrize("count", [len(TOKENS), 600])
def test_the_shared_prefill_is_the_callers_prefill(tiny_model: CausalLM, count: int) -> None:
    """Its KV is ``CausalLM.prefill``'s bit for bit; its rows give the reference (600 tokens
    run the output layer on blocks of rows)."""
    tokens = [(11 * i + 5) % tiny_model.vocab_size for i in range(count)]
    found = shared_prefill(tiny_model, tokens, with_surprisal=True)
    assert torch.equal(found.kv, tiny_model.kv_tensor(tiny_model.prefill(tokens)))
    assert found.surprisal is not None and found.surprisal.shape == (count - 1,)
    own = reference_surprisal(tiny_model, [tokens], tiny_model.start_token_id)
    shared = reference_surprisal(tiny_model, [tokens], tiny_model.start_token_id,
                                 prefilled=found)
    # two forwards of the same tokens on two thread counts: equal to float rounding
    np.testing.assert_allclose(shared, own, rtol=0, atol=1e-4)
    assert shared[0] == own[0]  # the start token's row, the same forward


def test_kv_takes_no_other_word(tiny_model: CausalLM) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="'prefill'"):
        compress(tiny_model, TOKENS, kv="prefil")  # type: ignore[arg-type]


SEGMENTS = [TOKENS[:6], TOKENS[6:12], TOKENS[12:]]


def _reference_forwards(model: CausalLM, run: Callable[[], object]) -> list[int]:
    with _forwards(model) as lengths:
        run()
    return lengths


def test_the_reference_forwards_the_start_token_once_for_all_segments(
        tiny_model: CausalLM) -> None:
    context = tiny_model.start_token_id
    together = _reference_forwards(
        tiny_model, lambda: reference_surprisal(tiny_model, SEGMENTS, context))
    assert sorted(together) == [1, 6, 6, 6]
    # the mutant: the start token forwarded per segment, as each segment alone does
    apart = _reference_forwards(
        tiny_model, lambda: [reference_surprisal(tiny_model, [s], context) for s in SEGMENTS])
    assert sorted(apart) == [1, 1, 1, 6, 6, 6] != sorted(together)
    np.testing.assert_array_equal(
        reference_surprisal(tiny_model, SEGMENTS, context),
        np.concatenate([reference_surprisal(tiny_model, [s], context) for s in SEGMENTS]))


def test_a_one_token_segment_runs_no_forward_of_its_own(tiny_model: CausalLM) -> None:
    assert _reference_forwards(
        tiny_model, lambda: reference_surprisal(tiny_model, [[7], [8]],
                                                tiny_model.start_token_id)) == [1]


@pytest.mark.real_model
def test_a_verified_compress_of_smollm2_at_portable_runs_three_float_forwards(
        real_model: CausalLM) -> None:
    tokens = real_model.encode_text("The quick brown fox jumps over the lazy dog. " * 3)
    _assert_three_forwards(real_model, tokens)
    _same_files(real_model, tokens, "portable")

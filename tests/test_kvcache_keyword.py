"""The KV cache reaches the model under the keyword its ``forward`` declares, on both sides of
transformers' rename of ``past_key_values`` to ``cache`` (5.19, which vLLM pins, and 5.24, the
project's): a forward that does not know the keyword swallows it in ``**kwargs`` and fills a
cache of its own, which left the cold tier's prefill empty inside vLLM (issue 45)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from seqkv.errors import ModelLoadError
from seqkv.kvcache import cache_from_tensor, tensor_from_cache, with_cache
from seqkv.models import CausalLM
from seqkv.models.adapter import Stepper

SOURCES = Path(__file__).parent.parent / "src" / "seqkv"


class LegacyLlama(LlamaForCausalLM):
    """transformers 5.19's signature: the cache is ``past_key_values``, and an unknown ``cache``
    keyword is swallowed (5.19 passes it on in ``**kwargs``; the model then builds its own)."""

    def forward(self, input_ids: torch.Tensor | None = None,  # type: ignore[override]
                past_key_values: DynamicCache | None = None, **kwargs: Any) -> Any:
        kwargs.pop("cache", None)
        return super().forward(input_ids=input_ids, cache=past_key_values, **kwargs)


def _tiny(model_class: type[LlamaForCausalLM]) -> CausalLM:
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    torch.manual_seed(0)
    return CausalLM(model_class(config), None, model_class.__name__)


@pytest.mark.parametrize("model_class", [LlamaForCausalLM, LegacyLlama])
def test_prefill_fills_the_callers_cache_under_either_keyword(
        model_class: type[LlamaForCausalLM]) -> None:
    tokens = [1, 5, 9, 3, 7, 11, 2]
    model, reference = _tiny(model_class), _tiny(LlamaForCausalLM)
    kv = tensor_from_cache(model.prefill(tokens))  # [L, 2, H, T, D]
    assert kv.shape == (2, 2, 2, len(tokens), 8)
    assert torch.equal(kv, tensor_from_cache(reference.prefill(tokens)))
    assert torch.equal(tensor_from_cache(cache_from_tensor(kv)), kv)
    # A token step continues from the cache it was given, not from an empty one.
    step = Stepper(model.model, cache_from_tensor(kv)).step(4)
    assert (step == Stepper(reference.model, cache_from_tensor(kv)).step(4)).all()
    assert not (step == Stepper(reference.model).step(4)).all()


def test_the_keyword_follows_decorators() -> None:
    def deprecating(function: Any) -> Any:  # as transformers' @deprecate_kwarg wraps forward
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)
        return wrapper

    class New(torch.nn.Module):
        @deprecating
        def forward(self, input_ids: torch.Tensor, cache: Any = None, **kwargs: Any) -> None:
            return None

    assert list(with_cache(New(), DynamicCache())) == ["cache"]


def test_a_forward_without_a_cache_keyword_is_refused_by_name() -> None:
    class Neither(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> None:
            return None

    with pytest.raises(ModelLoadError, match=r"Neither\.forward takes its KV cache under none"):
        with_cache(Neither(), DynamicCache())


def test_no_model_call_in_seqkv_names_the_cache_keyword_itself() -> None:
    """Every forward in ``src/seqkv`` gets its cache through ``with_cache``."""
    offenders = []
    for path in sorted(SOURCES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg in ("cache", "past_key_values"):
                        offenders.append(f"{path.relative_to(SOURCES)}:{node.lineno}")
    assert offenders == []

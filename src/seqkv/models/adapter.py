"""One adapter around a transformers causal LM: fingerprints, stepping and prefill.

The codec sees a model only through this adapter: its identity (what a file must be decoded
with), its KV geometry, and a ``Stepper`` that runs the decoder's schedule, one forward per token
on a ``DynamicCache``.

Invariants:
1. The identity hashes the config and every parameter's bytes: two models with equal identities
   compute the same function (enforced by construction).
2. ``Stepper.step`` returns the logits for the next position as float32 numpy; it appends the
   token's keys and values to ``Stepper.cache`` (the only thing it mutates).
3. The adapter never changes the wrapped model's weights or mode after ``__init__`` puts it in
   eval mode (enforced).
4. Every parameter sits in memory aligned to ``_ALIGNMENT`` bytes (enforced in ``__init__``,
   which copies any that are not). CPU kernels choose code paths by alignment: measured here, a
   tiny Llama's single-token steps differed by ~1e-7 between its weights in fresh memory and the
   same weights memory-mapped from a safetensors file at an offset of 40 bytes mod 64. Without
   this, equal identities would not imply equal probabilities.
5. ``derived`` builds an object derived from the model (e.g. its row-invariant forward) once
   per adapter and type, and keeps it; it is the only state an adapter adds after ``__init__``
   (enforced).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache, PreTrainedModel

from seqkv.errors import EmptyInputError, InvalidTokensError
from seqkv.kvcache import (
    AppendingCache,
    cache_from_tensor,
    cache_keyword,
    tensor_from_cache,
    with_cache,
)
from seqkv.schedule import current_profile, pinned_threads, schedule_threads
from seqkv.types import ExecutionProfile, KVGeometry, ModelIdentity, Schedule

_ALIGNMENT = 64  # bytes; what torch's CPU allocator guarantees for fresh tensors
# Config keys that name or date a checkpoint without changing what it computes. ``save_pretrained``
# fills in "architectures" and "dtype" on a model created in memory; the dtypes are in the weights
# hash (each tensor's dtype is hashed with its bytes).
_VOLATILE_CONFIG_KEYS = frozenset({
    "_name_or_path", "transformers_version", "_commit_hash", "architectures", "dtype",
    "torch_dtype",
})
_Derived = TypeVar("_Derived")


class Stepper:
    """Runs a model one token at a time on its own cache: the decoder's exact schedule."""

    def __init__(self, model: PreTrainedModel, cache: DynamicCache | None = None) -> None:
        self._model = model
        # appends in place: a step on a long cache does not copy it (``AppendingLayer``)
        self.cache = AppendingCache() if cache is None else cache
        # read once: a step is short enough on a small model for a signature read to show
        self._keyword = cache_keyword(model)
        self._backbone_keyword = cache_keyword(model.base_model)

    @torch.inference_mode()
    def step(self, token: int) -> npt.NDArray[np.float32]:
        ids = torch.tensor([[token]], dtype=torch.long, device=self._model.device)  # [1, 1]
        output = self._model(input_ids=ids, **{self._keyword: self.cache}, use_cache=True)
        logits: npt.NDArray[np.float32] = output.logits[0, -1].float().cpu().numpy()
        return logits

    @torch.inference_mode()
    def advance(self, token: int) -> None:
        """Append ``token``'s keys and values as ``step`` does, without computing the logits
        (the backbone alone: the same KV bits, a fifth less work on SmolLM2-135M)."""
        ids = torch.tensor([[token]], dtype=torch.long, device=self._model.device)  # [1, 1]
        self._model.base_model(input_ids=ids, **{self._backbone_keyword: self.cache},
                               use_cache=True)


class CausalLM:
    """A transformers causal LM (and optionally its tokenizer) as seqkv uses it."""

    def __init__(self, model: PreTrainedModel, tokenizer: Any | None, name: str) -> None:
        model.train(False)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.data_ptr() % _ALIGNMENT:
                    parameter.data = parameter.data.clone(memory_format=torch.contiguous_format)
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self._twins: dict[torch.dtype, PreTrainedModel] = {}
        self._derived: dict[type, object] = {}

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def kv_heads(self) -> int:
        heads = getattr(self.config, "num_key_value_heads", None)
        return int(heads if heads is not None else self.config.num_attention_heads)

    @property
    def head_dim(self) -> int:
        head_dim = getattr(self.config, "head_dim", None)
        if head_dim is None:
            head_dim = self.config.hidden_size // self.config.num_attention_heads
        return int(head_dim)

    @property
    def geometry(self) -> KVGeometry:
        return KVGeometry(self.num_layers, self.kv_heads, self.head_dim)

    @property
    def kv_components_per_token(self) -> int:
        """Keys and values of all layers and heads for one token position."""
        return self.geometry.components_per_token

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = self.model.dtype
        return dtype

    @property
    def device(self) -> torch.device:
        device: torch.device = self.model.device
        return device

    @property
    def start_token_id(self) -> int | None:
        """The token whose next-token distribution codes a sequence's first token."""
        bos = getattr(self.config, "bos_token_id", None)
        return int(bos) if isinstance(bos, int) and 0 <= bos < self.vocab_size else None

    def profile(self, schedule: Schedule = "token-by-token") -> ExecutionProfile:
        """The execution profile of ``schedule`` for this model here, without the row block
        (``seqkv.models.profiles.execution_profile`` adds it for the ``rows`` schedule)."""
        return current_profile(self.dtype, self.device, schedule)

    @cached_property
    def identity(self) -> ModelIdentity:
        config = {
            key: value
            for key, value in self.config.to_dict().items()
            if key not in _VOLATILE_CONFIG_KEYS
        }
        config_hash = hashlib.sha256(
            json.dumps(config, sort_keys=True, default=str).encode()
        ).hexdigest()
        weights = hashlib.sha256()
        for name, parameter in sorted(self.model.named_parameters()):
            weights.update(name.encode())
            tensor = parameter.detach().cpu().contiguous()
            weights.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
            weights.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
        tokenizer_hash = None
        if self.tokenizer is not None:
            vocab = sorted(self.tokenizer.get_vocab().items())
            special = sorted(str(t) for t in self.tokenizer.all_special_tokens)
            tokenizer_hash = hashlib.sha256(
                json.dumps([vocab, special]).encode()
            ).hexdigest()
        return ModelIdentity(self.name, config_hash, weights.hexdigest(), tokenizer_hash)

    def twin(self, dtype: torch.dtype) -> PreTrainedModel:
        """The network copied to ``dtype`` (kept for later calls): an independent reference,
        e.g. float64 for recomputing a cross-entropy. The model's own dtype returns itself."""
        if dtype == self.dtype:
            return self.model
        twin = self._twins.get(dtype)
        if twin is None:
            twin = copy.deepcopy(self.model)
            torch.nn.Module.to(twin, dtype)  # in place (transformers' typed wrapper of .to
            # does not accept a dtype argument for mypy)
            twin.train(False)
            self._twins[dtype] = twin
        return twin

    def derived(self, kind: type[_Derived], build: Callable[[CausalLM], _Derived]) -> _Derived:
        """The ``kind`` object derived from this model, built by ``build(self)`` on the first
        request and kept: e.g. ``seqkv.models.rows.row_forward``, whose calibration and rotary
        tables are computed once per model."""
        held = self._derived.get(kind)
        if held is None:
            held = build(self)
            self._derived[kind] = held
        assert isinstance(held, kind), "a derived object is kept under its own type"
        return held

    def stepped_kv(self, tokens: Sequence[int]) -> torch.Tensor:
        """The KV ``[layers, 2, kv_heads, T, head_dim]`` (float32, CPU) that stepping ``tokens``
        one at a time leaves: what the ``tokens`` level's decoder rebuilds."""
        stepper = self.new_stepper()
        for token in tokens:
            stepper.advance(int(token))
        return self.kv_tensor(stepper.cache)

    def new_stepper(self, kv: torch.Tensor | None = None) -> Stepper:
        """A stepper whose cache starts empty, or holding ``kv`` ``[L, 2, H, T, D]``."""
        if kv is None or kv.shape[3] == 0:
            return Stepper(self.model)
        return Stepper(self.model,
                       cache_from_tensor(kv.to(self.device, self.dtype), appending=True))

    def check_tokens(self, tokens: list[int]) -> None:
        """Raise a clear error unless ``tokens`` is a non-empty list of valid ids that fits the
        model's context (``max_position_embeddings``), before any forward runs."""
        from seqkv.errors import InputTooLongError

        if len(tokens) == 0:
            raise EmptyInputError("there are no tokens to code: the input is empty")
        context = getattr(self.config, "max_position_embeddings", None)
        if isinstance(context, int) and len(tokens) > context:
            raise InputTooLongError(
                f"{len(tokens):,} tokens are more than this model's context of {context:,} "
                "positions: split the input into sessions that fit"
            )
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidTokensError(
                f"{len(bad)} token ids are outside this model's vocabulary of {self.vocab_size} "
                f"(first: {bad[0]}); were they produced by another tokenizer?"
            )

    @torch.inference_mode()
    def prefill(self, tokens: list[int]) -> DynamicCache:
        """The KV cache of one full forward over ``tokens`` (what a serving engine would hold).

        Like a serving engine's prefill, it computes the output layer for the last position
        only (``logits_to_keep=1``): the KV does not depend on it, and the rest of the
        ``[T, vocab]`` logits would be a sizeable share of the prefill (the head is the widest
        layer).

        It runs on the ``prefill`` schedule's threads whatever the caller's setting: a float
        forward's bits depend on the thread count, and the levels that rebuild the KV with one
        prefill (``seqkv.levels.kv_rebuild``) then reproduce this cache bit for bit on any
        machine, not only where torch's default is that count."""
        self.check_tokens(tokens)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)  # [1, T]
        cache = DynamicCache()
        with pinned_threads(schedule_threads("prefill")):
            self.model(input_ids=ids, **with_cache(self.model, cache), use_cache=True,
                       logits_to_keep=1)
        return cache

    def kv_tensor(self, cache: DynamicCache) -> torch.Tensor:
        """``cache`` as ``[layers, 2, kv_heads, tokens, head_dim]`` float32 on the CPU."""
        return tensor_from_cache(cache).detach().to("cpu", torch.float32)

    def encode_text(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise InvalidTokensError(f"model {self.name!r} has no tokenizer: pass token ids")
        if not text:
            raise EmptyInputError("the text is empty: there is nothing to compress")
        ids: list[int] = self.tokenizer(text, add_special_tokens=False).input_ids
        if not ids:
            raise EmptyInputError("the text tokenizes to no tokens: there is nothing to compress")
        return ids

    def decode_tokens(self, tokens: list[int]) -> str:
        if self.tokenizer is None:
            raise InvalidTokensError(f"model {self.name!r} has no tokenizer to turn ids into text")
        text: str = self.tokenizer.decode(tokens, skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False)
        return text

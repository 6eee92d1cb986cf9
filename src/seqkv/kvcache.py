"""Conversions between transformers' ``DynamicCache`` and one stacked KV tensor.

seqkv works on a single session's cache as one float tensor of shape
``[layers, 2, kv_heads, tokens, head_dim]`` (index 0 of the second axis holds keys, 1 values).

Invariants:
1. Only batch size 1 is accepted: a .skv file holds one session (enforced, InvalidKVError).
2. ``cache_from_tensor(tensor_from_cache(c))`` holds the same keys and values as ``c``
   (checked by tests).
3. An ``AppendingCache`` hands the attention the same keys and values, in the same order, as a
   ``DynamicCache`` fed the same updates, and a forward over it gives the same bits (checked by
   tests: logits and KV of token steps across many moves to new buffers, from an empty cache
   and from a stored prefix); a tensor it returned never changes afterwards (it writes only
   past every view it gave out, or into a new buffer; checked across crops).
4. A model is always handed its cache under the keyword its own ``forward`` declares
   (``with_cache``): transformers renamed ``past_key_values`` to ``cache`` (5.19, which vLLM
   pins, takes ``past_key_values``; 5.24 takes ``cache``), and a forward that does not know the
   keyword swallows it in ``**kwargs`` and fills a cache of its own, leaving the caller's empty
   (enforced; a model that declares neither is refused by name; checked by tests with both
   signatures).
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from seqkv.digests import Digest, digest
from seqkv.errors import InvalidKVError, ModelLoadError

CACHE_KEYWORDS = ("cache", "past_key_values")
"""The keywords a transformers ``forward`` takes its KV cache under, newest first."""


def cache_keyword(module: torch.nn.Module) -> str:
    """The keyword ``module.forward`` takes its KV cache under (``CACHE_KEYWORDS``)."""
    # NOTE: the class's forward, as an instance may wrap its own in a (*args, **kwargs) (hooks,
    # tests); not memoized: a signature is read in tens of microseconds, a forward takes
    # milliseconds, and a memo would be module-global state.
    # A wrapper that hides the signature (a (*args, **kwargs) patched onto the class) passes
    # the keyword through to the forward it wraps, whose base model (``base_model``, a
    # transformers ``PreTrainedModel`` property) declares the same keyword.
    base = getattr(module, "base_model", None)
    candidates = [module, *([base] if isinstance(base, torch.nn.Module) and base is not module
                            else [])]
    for candidate in candidates:
        parameters = inspect.signature(type(candidate).forward).parameters  # follows __wrapped__
        for keyword in CACHE_KEYWORDS:
            if keyword in parameters:
                return keyword
    import transformers

    raise ModelLoadError(
        f"{type(module).__name__}.forward takes its KV cache under none of {CACHE_KEYWORDS} "
        f"(transformers {transformers.__version__}): seqkv supports transformers releases "
        "whose models take `cache` or `past_key_values`"
    )


def with_cache(module: torch.nn.Module, cache: Cache) -> dict[str, Cache]:
    """``{keyword: cache}`` for ``module(**with_cache(module, cache), ...)``, under the keyword
    ``module.forward`` declares (invariant 4 of the module docstring).

    >>> class Old(torch.nn.Module):
    ...     def forward(self, input_ids, past_key_values=None, **kwargs): ...
    >>> list(with_cache(Old(), DynamicCache()))
    ['past_key_values']
    """
    return {cache_keyword(module): cache}


def kv_digest(kv: torch.Tensor) -> Digest:
    """The digest of a KV tensor's float32 bytes, hashed in place (a contiguous float32 CPU
    tensor is not copied: a 4,000-token SmolLM2 KV is 184 MB)."""
    array = np.ascontiguousarray(kv.detach().to("cpu", torch.float32).numpy())
    return digest(array.data.cast("B"))


def tensor_from_cache(cache: DynamicCache) -> torch.Tensor:
    """Stack a batch-1 cache into ``[layers, 2, kv_heads, tokens, head_dim]``."""
    stacked = []
    for index, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)):
            raise InvalidKVError(f"layer {index} of the KV cache holds no keys and values")
        if keys.dim() != 4 or keys.shape != values.shape:
            raise InvalidKVError(f"layer {index} of the KV cache has no [B, H, T, D] keys/values")
        if keys.shape[0] != 1:
            raise InvalidKVError(
                f"the KV cache has batch size {keys.shape[0]}; seqkv stores one session per "
                "file: split the batch first"
            )
        stacked.append(torch.stack([keys[0], values[0]]))  # [2, H, T, D]
    if not stacked:
        raise InvalidKVError("the KV cache is empty: it holds no layers")
    shapes = {tuple(s.shape) for s in stacked}
    if len(shapes) != 1:
        raise InvalidKVError(f"KV cache layers have different shapes: {sorted(shapes)}")
    return torch.stack(stacked)  # [L, 2, H, T, D]


# NOTE: room an appending layer leaves past what it holds when it moves to a new buffer, as a
# fraction of that length (at least MIN_HEADROOM positions): geometric growth, so a session of
# T steps copies O(T) positions in all, with at most half its KV again in unused room.
HEADROOM = 0.5
MIN_HEADROOM = 256


class AppendingLayer(DynamicLayer):  # type: ignore[no-untyped-call]  # its __init_subclass__
    """A ``DynamicLayer`` that appends a step's keys and values into room it keeps past them.

    ``DynamicLayer.update`` concatenates: every step copies the layer's whole cache, which at
    8,000 positions of SmolLM2-135M is 377 MB read and written per token step, half the step's
    time on one thread (``torch.profiler``: ``aten::cat`` 49% of a step). This layer keeps its
    keys and values in a buffer with room to spare and returns views of the filled part; the
    attention reads the same numbers in the same order (invariant 3 of the module).

    It writes in place only while ``keys`` and ``values`` are still the views it returned last,
    past their end; after a crop, a batch selection or anything else that replaced them, the
    next update moves to a new buffer, so no tensor handed out earlier ever changes. The first
    update of an empty layer is ``DynamicLayer``'s own (a prefill keeps a contiguous cache)."""

    def __init__(self, min_headroom: int | None = None, headroom: float | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._min_headroom = MIN_HEADROOM if min_headroom is None else min_headroom
        self._headroom = HEADROOM if headroom is None else headroom
        # the buffers, and the views of them this layer returned last
        self._key_room: torch.Tensor | None = None
        self._value_room: torch.Tensor | None = None
        self._returned: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys, self.values
        if keys is None or values is None or self.get_seq_length() == 0:
            self._key_room = self._value_room = self._returned = None
            return super().update(key_states, value_states, *args, **kwargs)
        length = int(keys.shape[-2])
        needed = length + int(key_states.shape[-2])
        key_room, value_room, returned = self._key_room, self._value_room, self._returned
        if (key_room is None or value_room is None or returned is None
                or returned[0] is not keys or returned[1] is not values
                or key_room.shape[-2] < needed):
            shape = list(keys.shape)
            shape[-2] = needed + max(self._min_headroom, int(needed * self._headroom))
            key_room, value_room = keys.new_empty(shape), values.new_empty(shape)
            key_room[..., :length, :].copy_(keys)
            value_room[..., :length, :].copy_(values)
            self._key_room, self._value_room = key_room, value_room
        key_room[..., length:needed, :].copy_(key_states)
        value_room[..., length:needed, :].copy_(value_states)
        filled_keys, filled_values = key_room[..., :needed, :], value_room[..., :needed, :]
        self.keys, self.values = filled_keys, filled_values
        self._returned = filled_keys, filled_values
        return filled_keys, filled_values


class AppendingCache(DynamicCache):
    """A ``DynamicCache`` of ``AppendingLayer``s: for one token (or a few) at a time on a long
    cache, where concatenation would copy the whole cache each step."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=AppendingLayer)


def cache_from_tensor(kv: torch.Tensor, batch: int = 1, *,
                      appending: bool = False) -> DynamicCache:
    """A ``DynamicCache`` holding ``kv`` (``[layers, 2, kv_heads, tokens, head_dim]``) for each
    of ``batch`` sequences (copies: a step appends to every row); an ``AppendingCache`` when
    ``appending``."""
    if kv.dim() != 5 or kv.shape[1] != 2:
        raise InvalidKVError(f"expected a [layers, 2, heads, tokens, dim] tensor, got {kv.shape}")
    cache = AppendingCache() if appending else DynamicCache()
    for layer in range(kv.shape[0]):
        keys = kv[layer, 0].unsqueeze(0).expand(batch, -1, -1, -1).contiguous()  # [B, H, T, D]
        values = kv[layer, 1].unsqueeze(0).expand(batch, -1, -1, -1).contiguous()  # [B, H, T, D]
        cache.update(keys, values, layer)
    return cache


def batch_row(cache: DynamicCache, row: int) -> torch.Tensor:
    """Row ``row`` of a batched cache as ``[layers, 2, kv_heads, tokens, head_dim]`` float32 on
    the CPU."""
    stacked = []
    for index, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)):
            raise InvalidKVError(f"layer {index} of the KV cache holds no keys and values")
        stacked.append(torch.stack([keys[row], values[row]]))  # [2, H, T, D]
    return torch.stack(stacked).detach().to("cpu", torch.float32)  # [L, 2, H, T, D]

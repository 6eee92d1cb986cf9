"""Which backbone serves which transformers ``config.model_type``: one line per architecture.

Invariants:
1. ``FAMILIES`` is read-only (enforced: a ``MappingProxyType``); adding an architecture is one
   line here and one file beside this one (``base``'s docstring says how).
2. ``backbone_for`` returns a backbone bound to the model, or raises ``UnsupportedModelError``
   naming the model type and what seqkv lacks for it (enforced).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from seqkv.errors import UnsupportedModelError
from seqkv.models.adapter import CausalLM
from seqkv.models.backbones.base import Backbone
from seqkv.models.backbones.gpt_neox import GPTNeoXBackbone
from seqkv.models.backbones.llama import LlamaBackbone

FAMILIES: Mapping[str, Callable[[CausalLM], Backbone]] = MappingProxyType({
    "llama": LlamaBackbone,
    "mistral": LlamaBackbone,
    "qwen2": LlamaBackbone,
    "gpt_neox": GPTNeoXBackbone,
})


def backbone_for(model: CausalLM) -> Backbone:
    """The backbone of ``model``'s architecture, bound to its modules.

    >>> from seqkv.models.tiny import tiny_random_llama
    >>> backbone_for(tiny_random_llama()).geometry.kv_heads
    2
    """
    model_type = getattr(model.config, "model_type", None)
    build = FAMILIES.get(str(model_type))
    if build is None:
        raise UnsupportedModelError(
            f"seqkv's own forwards have no backbone for model type {model_type!r} (they cover "
            f"{', '.join(sorted(FAMILIES))}): it lacks a file in seqkv/models/backbones/ and a "
            "line in its registry; code this model at the 'tokens' level"
        )
    return build(model)

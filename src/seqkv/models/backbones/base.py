"""What seqkv's own forward drivers need from a decoder-only transformer: the ``Backbone``.

Motivation: seqkv runs its own forwards over a transformers model where transformers' forward
cannot give what it needs: the row-invariant forward (``seqkv.models.rows``) stores keys and
values in its own pool and attends one row at a time; the distortion metrics
(``seqkv.delta.metrics``) read each layer's queries; the injectivity premise
(``seqkv.models.collisions``) needs the first layer's keys and values of every vocabulary id. Each
of them needs an architecture's module names. A ``Backbone`` is the one place that knows an
architecture's modules: the drivers see only its geometry and a few steps, and every attention
goes through the driver's ``Attend`` callback, so a driver decides where keys and values live
and how a query attends to them while the backbone decides everything else (norms,
projections, rotary embedding, residual wiring, MLP, head).

The steps, on rows (``N`` token rows of one call, any mix of sequences and positions)::

    hidden = backbone.embed(ids)                          # [N] -> [N, hidden]
    cos, sin = backbone.rotary(positions)                 # [N] -> [N, rotary_dim] each
    for index in range(backbone.geometry.layers):
        hidden = backbone.block(index, hidden, cos, sin, attend)
    logits = backbone.head(hidden)                        # [N, hidden] -> [N, vocab]

where ``attend(index, q, k, v)`` receives the layer's rotated queries ``[N, heads, head_dim]``,
rotated keys and values ``[N, kv_heads, head_dim]`` and returns the attention output
``[N, heads, head_dim]`` (softmax scale ``geometry.scale``; query head ``h`` reads KV head
``h // geometry.groups``).

Adding an architecture (one file and one registry line):

1. Write ``src/seqkv/models/backbones/<family>.py`` with a class whose ``__init__`` takes a
   ``CausalLM`` and that implements ``Backbone`` by calling the model's own modules (norms,
   projections, MLP, head) and this module's helpers (``rotate``, ``rotary_tables``,
   ``submodule``, ``static_rope``); refuse what it does not cover with ``UnsupportedModelError``
   naming the model type and the missing piece. ``llama.py`` (separate q/k/v projections, RMSNorm,
   sequential residual) and ``gpt_neox.py`` (fused qkv, partial rotary, LayerNorm, parallel
   residual) are the two templates.
2. Add one line ``"<config.model_type>": <Class>,`` to ``FAMILIES`` in
   ``src/seqkv/models/backbones/registry.py``.

Then add a tiny random model of the type to ``seqkv.models.tiny`` and one entry to
``FAMILY_MODELS`` in ``tests/backbone_cases.py``: the tests then check the new family against
transformers' own forward, row invariance, recomputation, the delta metrics and predictors and the
first-layer KV (``tests/test_backbones.py`` fails until every registered model type has one).

Invariants:
1. A backbone computes its model's function: ``block`` calls the model's own modules in the
   order of transformers' layer forward, and only the attention core is the driver's (checked:
   ``tests/test_backbones.py`` compares a full forward with transformers' on a tiny random model
   of every registered family, to float32 noise).
2. Every step is row-wise: row ``i`` of an output depends on row ``i`` of the inputs and on what
   ``attend`` returns for it, never on other rows, except through the model's linear layers,
   whose row invariance the caller secures (``seqkv.models.rows.calibrate_row_block``) (assumed
   of norms, activations and elementwise ops; checked by the row-invariance tests of every
   family).
3. Rotary tables depend on positions only (enforced: ``static_rope`` refuses the rope types that
   rescale with the sequence length seen, ``dynamic`` and ``longrope``).
4. A backbone never changes the model's weights or mode; ``block`` mutates nothing but what the
   driver's ``attend`` mutates (enforced: no step writes to a module or buffer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from seqkv.errors import UnsupportedModelError
from seqkv.models.adapter import CausalLM

# NOTE: rope types whose tables change with the longest sequence seen (transformers'
# ``dynamic_rope_update``): a position's rotation would depend on the other positions of a call.
_LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


@dataclass(frozen=True, slots=True)
class BackboneGeometry:
    """The shapes a driver allocates for: layers, heads, dimensions, vocabulary, positions.

    >>> BackboneGeometry(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, rotary_dim=16,
    ...                  vocab=512, max_positions=4096, scale=0.25).groups
    2
    """

    layers: int
    hidden: int
    heads: int  # query heads
    kv_heads: int  # key/value heads (fewer than ``heads`` under grouped-query attention)
    head_dim: int
    rotary_dim: int  # leading dimensions of each head that the rotary embedding turns
    vocab: int
    max_positions: int
    scale: float  # softmax scale of the attention scores, as the model's attention module has it

    @property
    def groups(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads


class Attend(Protocol):
    """A driver's attention core for one layer of one call."""

    def __call__(self, index: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        """Layer ``index``: q ``[N, heads, head_dim]``, k and v ``[N, kv_heads, head_dim]``
        (rotated, this call's rows) -> attention output ``[N, heads, head_dim]``."""
        ...


class Backbone(Protocol):
    """One decoder-only architecture, bound to one model (see the module docstring)."""

    @property
    def geometry(self) -> BackboneGeometry: ...

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``[N]`` -> hidden rows ``[N, hidden]``."""
        ...

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``[N]`` -> the rotary ``cos``, ``sin`` tables ``[N, rotary_dim]``."""
        ...

    def block(self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              attend: Attend) -> torch.Tensor:
        """Layer ``index`` on hidden rows ``[N, hidden]`` -> ``[N, hidden]``, its attention
        core computed by ``attend``."""
        ...

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: ``[N, hidden]`` -> logits ``[N, vocab]``."""
        ...

    def first_layer_kv(self, ids: torch.Tensor) -> torch.Tensor:
        """Layer 0's key and value of each id alone at position 0 (where the rotation is the
        identity): ``[N]`` -> ``[N, 2, kv_heads, head_dim]``."""
        ...


def apply(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``, typed (torch types a module call as ``Any``)."""
    out: torch.Tensor = module(x)
    return out


def submodule(root: nn.Module, path: str, model_type: str, family: str) -> nn.Module:
    """The module at dotted ``path`` under ``root``, or an error naming what is missing."""
    found: object = root
    for name in path.split("."):
        found = getattr(found, name, None)
    if not isinstance(found, nn.Module):
        raise UnsupportedModelError(
            f"this {model_type!r} model has no module {path!r}, which the {family} backbone of "
            "seqkv's own forwards reads: it does not have the layout its model type promises; "
            "code it at the 'tokens' level"
        )
    return found


def layer_list(root: nn.Module, path: str, model_type: str, family: str) -> list[nn.Module]:
    """The decoder layers at ``path`` under ``root``, or an error naming what is missing."""
    layers = submodule(root, path, model_type, family)
    if not isinstance(layers, nn.ModuleList):
        raise UnsupportedModelError(
            f"this {model_type!r} model's {path!r} is a {type(layers).__name__}, not the list of "
            f"decoder layers the {family} backbone reads; code it at the 'tokens' level"
        )
    return list(layers)


def embeddings(model: CausalLM, model_type: str, family: str) -> tuple[nn.Module, nn.Module]:
    """The model's input embedding and LM head, through transformers' accessors."""
    network: Any = model.model
    found = (network.get_input_embeddings(), network.get_output_embeddings())
    for module, what in zip(found, ("input embedding", "output embedding (LM head)"),
                            strict=True):
        if not isinstance(module, nn.Module):
            raise UnsupportedModelError(
                f"this {model_type!r} model has no {what}, which the {family} backbone of "
                "seqkv's own forwards reads; code it at the 'tokens' level"
            )
    return found


def static_rope(rotary: nn.Module, model_type: str) -> nn.Module:
    """``rotary`` (a transformers rotary-embedding module), refused if its tables depend on the
    sequence length."""
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type in _LENGTH_DEPENDENT_ROPE:
        raise UnsupportedModelError(
            f"this {model_type!r} model uses the {rope_type!r} rotary embedding, whose tables "
            "change with the sequence length: seqkv's own forwards need static tables (one row "
            "per position); code it at the 'tokens' level"
        )
    return rotary


def rotary_tables(rotary: nn.Module, positions: torch.Tensor,
                  like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own rotary module on ``positions`` ``[N]``: ``cos``, ``sin`` ``[N, dim]`` in
    ``like``'s dtype, computed in one call as transformers' forward computes them."""
    cos, sin = rotary(like, positions[None])  # [1, N, dim] each
    return cos[0], sin[0]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in transformers' convention (halves rotated) on the leading
    ``cos.shape[-1]`` dimensions of ``x``; the rest pass through (partial rotary)."""
    dims = cos.shape[-1]
    if dims == x.shape[-1]:
        half = dims // 2
        turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + turned * sin
    return torch.cat((rotate(x[..., :dims], cos, sin), x[..., dims:]), dim=-1)

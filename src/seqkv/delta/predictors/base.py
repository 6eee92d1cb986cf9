"""The predictor contract of the delta coder: what a KV vector is predicted from, and its cost.

Motivation: layer 2 of arXiv 2604.15356 codes each token position's KV as a prediction plus a
quantized residual. Predictors differ in what they use (nothing, the decoded previous vectors,
the model over the decoded prefix, the model over the tokens) and in what they cost (forward
passes). Each predictor lives in its own module behind the :class:`Predictor` protocol; the
codec (``seqkv.delta.delta_codec``) drives one :class:`PredictionSession` per encode or decode.

Protocol of a session, for positions ``i = 0 .. T-1`` in order: ``predict(i)`` returns the
prediction of ``KV[:, :, :, i, :]`` (``[layers, 2, kv_heads, head_dim]`` float32), then
``observe(i, decoded)`` hands it the decoded vector at ``i`` (prediction plus dequantized
residual). ``observe`` is the only call that mutates a session.

Invariants:
1. ``predict(i)`` depends only on the model, the predictor's settings, the tokens (when
   ``needs_tokens``) and the decoded vectors at positions ``< i``: the decoder can rebuild it
   (enforced by construction: a session sees nothing else).
2. Encoder and decoder obtain bit-identical predictions: all model forwards run inside
   ``seqkv.schedule.pinned_threads`` with the same shapes in the same order (enforced by the
   codec; checked: the round-trip tests compare the decoded KV bit for bit).
3. ``cost`` counts every model forward a session ran: ``calls`` invocations, ``rows`` token
   rows in total (a batch of k single-token candidates is 1 call, k rows) (enforced).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch

from seqkv.errors import InvalidTokensError
from seqkv.models.adapter import CausalLM

PredictorName = Literal["none", "previous_token", "topk_expectation", "exact_recompute"]
"""The predictors of ``seqkv.delta.predictors``, one module each."""


@dataclass(frozen=True)
class ForwardCost:
    """Model forwards: ``calls`` invocations processing ``rows`` token rows in total."""

    calls: int = 0
    rows: int = 0

    def __add__(self, other: ForwardCost) -> ForwardCost:
        return ForwardCost(self.calls + other.calls, self.rows + other.rows)


@dataclass(frozen=True)
class PredictorContext:
    """What a session may use: the model, the tokens (only if ``needs_tokens``), the length."""

    model: CausalLM
    tokens: tuple[int, ...] | None
    num_tokens: int


class PredictionSession(Protocol):
    """One sequential pass of a predictor over ``num_tokens`` positions."""

    def predict(self, position: int) -> torch.Tensor:
        """The prediction at ``position``: ``[layers, 2, kv_heads, head_dim]`` float32."""
        ...

    def observe(self, position: int, decoded: torch.Tensor) -> None:
        """Record the decoded vector at ``position`` (``[layers, 2, kv_heads, head_dim]``)."""
        ...

    @property
    def cost(self) -> ForwardCost: ...


@runtime_checkable
class Predictor(Protocol):
    """A KV predictor; instances are frozen settings and build sessions with :meth:`start`."""

    @property
    def name(self) -> PredictorName: ...

    @property
    def label(self) -> str:
        """Short human-readable name with the settings, for tables and plots."""
        ...

    @property
    def needs_tokens(self) -> bool:
        """Whether the decoder needs the tokens (the delta coder then stores and counts them)."""
        ...

    def start(self, context: PredictorContext) -> PredictionSession: ...


def zeros_like_position(model: CausalLM) -> torch.Tensor:
    """A zero prediction ``[layers, 2, kv_heads, head_dim]`` for ``model``."""
    return torch.zeros(model.num_layers, 2, model.kv_heads, model.head_dim)


def require_tokens(context: PredictorContext, who: str) -> Sequence[int]:
    """The context's tokens, or an ``InvalidTokensError`` saying that ``who`` needs them."""
    if context.tokens is None:
        raise InvalidTokensError(f"the {who} predictor needs the tokens: pass them to the codec")
    if len(context.tokens) != context.num_tokens:
        raise InvalidTokensError(
            f"got {len(context.tokens)} tokens for a KV cache of {context.num_tokens} positions"
        )
    return context.tokens


class SequentialCheck:
    """Asserts the session protocol (``predict(i)``, ``observe(i)``, ``i`` increasing)."""

    def __init__(self) -> None:
        self._next = 0
        self._predicted = False

    def predicted(self, position: int) -> None:
        assert position == self._next and not self._predicted, "predict out of order"
        self._predicted = True

    def observed(self, position: int) -> None:
        assert position == self._next and self._predicted, "observe before predict"
        self._predicted = False
        self._next += 1

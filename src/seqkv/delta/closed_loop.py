"""The closed loop of predictive delta coding, stated once for every coder that runs it.

Motivation: a delta coder predicts each step's KV from what the decoder has already rebuilt,
quantizes the residual and rebuilds the step as the decoder will. ``seqkv.delta.delta_codec``
runs the loop position by position with any predictor and a width per position; the warm tier
(``seqkv.warm.codec``) runs it over steps of many positions and many segments at once. Both
drive this module, so the encoder's rebuilt KV and the decoder's are one expression, not two
copies that can drift apart.

For steps ``s = 0 .. n-1``::

    pred_s    = predictor.predict(s)              from steps observed before s only
    code_s    = quantizer.quantize(s, target_s - pred_s)
    decoded_s = pred_s + quantizer.dequantize(s, code_s)
    predictor.observe(s, decoded_s)

``decode_loop`` runs the same steps with the stored codes in place of ``quantize``.

Invariants:
1. ``decode_loop`` over the codes ``encode_loop`` yielded, with a predictor and a quantizer in
   the same state, yields the encoder's ``decoded`` bit for bit (enforced: both compute
   ``_rebuilt(pred, dequantize(code))`` in the same step order; checked by
   ``tests/test_delta_closed_loop.py`` with signed zeros).
2. Closed loop: a step's prediction is built from decoded values only, never from the target,
   so quantization error does not accumulate (enforced: the predictor sees ``observe`` calls
   with decoded values only).
3. The loop adds nothing to what is stored: what a coder keeps of each ``code`` is its own
   (``seqkv.delta.delta_codec``: entropy-coded; ``seqkv.warm.codec``: raw fields).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from seqkv.quantizers import QuantizedTensor


class LoopPredictor(Protocol):
    """What a step is predicted from: the decoded values of earlier steps (a
    ``seqkv.delta.predictors.PredictionSession`` is one, its steps the positions)."""

    def predict(self, step: int, /) -> torch.Tensor:
        """The prediction of ``step``, the shape of its target."""
        ...

    def observe(self, step: int, decoded: torch.Tensor, /) -> None:
        """Record ``step``'s decoded values (what the decoder rebuilds)."""
        ...


class StepQuantizer(Protocol):
    """How each step's residual is quantized (a step may have its own width)."""

    def quantize(self, step: int, residual: torch.Tensor) -> QuantizedTensor: ...

    def dequantize(self, step: int, code: QuantizedTensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class EncodedStep:
    """One step of the encoder's loop."""

    step: int
    code: QuantizedTensor
    prediction: torch.Tensor
    decoded: torch.Tensor
    """``prediction + dequantize(code)``: what the decoder rebuilds."""


def _rebuilt(prediction: torch.Tensor, restored: torch.Tensor) -> torch.Tensor:
    """A step's decoded values: the one expression encoder and decoder share (invariant 1)."""
    return prediction + restored


def encode_loop(num_steps: int, target: Callable[[int], torch.Tensor],
                predictor: LoopPredictor, quantizer: StepQuantizer) -> Iterator[EncodedStep]:
    """Each step's code, prediction and decoded values, in order; ``target(s)`` is step ``s``'s
    KV. The predictor observes each step's decoded values before the next step is predicted.

    >>> class Previous:   # predicts each step as the one decoded before it
    ...     def __init__(self): self.last = torch.zeros(2)
    ...     def predict(self, step): return self.last
    ...     def observe(self, step, decoded): self.last = decoded
    >>> class Halves:     # codes a residual to the nearest half
    ...     def quantize(self, step, residual):
    ...         return QuantizedTensor("int8", tuple(residual.shape), residual.dtype, None,
    ...                                scales=(2 * residual).round())
    ...     def dequantize(self, step, code): return code.scales / 2
    >>> data = torch.tensor([[1.2, 0.0], [1.9, -0.6]])
    >>> steps = list(encode_loop(2, data.__getitem__, Previous(), Halves()))
    >>> [s.decoded.tolist() for s in steps]
    [[1.0, 0.0], [2.0, -0.5]]
    >>> [v.tolist() for v in decode_loop(2, [s.code for s in steps].__getitem__, Previous(),
    ...                                  Halves())]
    [[1.0, 0.0], [2.0, -0.5]]
    """
    for step in range(num_steps):
        prediction = predictor.predict(step)
        code = quantizer.quantize(step, target(step) - prediction)
        decoded = _rebuilt(prediction, quantizer.dequantize(step, code))
        predictor.observe(step, decoded)
        yield EncodedStep(step, code, prediction, decoded)


def decode_loop(num_steps: int, code: Callable[[int], QuantizedTensor],
                predictor: LoopPredictor, quantizer: StepQuantizer) -> Iterator[torch.Tensor]:
    """Each step's decoded values, in order, from ``code(s)`` (the codes ``encode_loop``
    yielded, or ones read back from storage)."""
    for step in range(num_steps):
        prediction = predictor.predict(step)
        decoded = _rebuilt(prediction, quantizer.dequantize(step, code(step)))
        predictor.observe(step, decoded)
        yield decoded

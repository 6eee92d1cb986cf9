"""The ``tokens`` level: the model's own forward, one token per step, the fewest bits.

Tokens are coded under transformers' forward run exactly as the decoder must run it: one forward
per token on a growing ``DynamicCache``, float32, one intra-op thread (the ``token-by-token``
schedule of ``seqkv.schedule``). Decoding costs one forward step per token, what plain
token-by-token generation costs.

Invariants:
1. The first token is coded under the model's distribution after the start token (BOS), or
   uniformly when the model has none; after a shared prefix, the stepper starts from the prefix's
   stored KV without its last position and steps the prefix's last token, so encoder and decoder
   start from the same stored bits (enforced).
2. The KV the level returns is the stepper's cache after the last token: what a decode rebuilds
   (enforced: both sides run the same loop inside ``pinned_threads``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from seqkv.coding.frequencies import uniform_distribution
from seqkv.levels import base
from seqkv.levels.base import (
    DecodeOutput,
    DecodeRequest,
    Distribution,
    EncodeOutput,
    EncodeRequest,
    LevelSpec,
)
from seqkv.models.adapter import CausalLM, Stepper
from seqkv.progress import tracked
from seqkv.schedule import pinned_threads
from seqkv.session import Prefix


def start(model: CausalLM, context: int | None,
          prefix: Prefix | None) -> tuple[Stepper, Distribution]:
    """The stepper and the distribution the first coded token is coded under."""
    if prefix is not None:
        assert prefix.kv is not None
        stepper = model.new_stepper(prefix.kv[:, :, :, : len(prefix.tokens) - 1])
        return stepper, base.model_distribution(stepper.step(prefix.tokens[-1]))
    if context is None:
        return model.new_stepper(), uniform_distribution(model.vocab_size)
    return model.new_stepper(), base.model_distribution(Stepper(model.model).step(context))


@dataclass(frozen=True)
class TokensLevel:
    """One transformers forward per token (see the module docstring)."""

    @property
    def spec(self) -> LevelSpec:
        return LevelSpec("tokens", model_coded=True, schedule="token-by-token",
                         decoding="one forward step per token")

    def encode(self, request: EncodeRequest) -> EncodeOutput:
        model, tail = request.model, request.tail
        recorder = request.new_trace()
        with pinned_threads():
            stepper, (table, log2p) = start(model, request.context, request.prefix)
            for position, token in enumerate(tracked(tail, request.progress, "encoding", "tok",
                                                     len(tail))):
                request.encoder.encode(table, token)
                recorder.record(log2p, table, token)
                logits = stepper.step(token)
                if position + 1 < len(tail):
                    table, log2p = base.model_distribution(logits)
        started = request.prefix is not None or request.context is not None
        return EncodeOutput(recorder, model.kv_tensor(stepper.cache), [len(tail)],
                            len(tail) + (1 if started else 0))

    def decode(self, model: CausalLM | None,
               requests: Sequence[DecodeRequest]) -> list[DecodeOutput]:
        assert model is not None, "the tokens level needs the model"
        return [self._decode_one(model, request) for request in requests]

    @staticmethod
    def _decode_one(model: CausalLM, request: DecodeRequest) -> DecodeOutput:
        tail: list[int] = []
        trace = request.new_trace()
        with pinned_threads():
            stepper, (table, log2p) = start(model, request.context, request.prefix)
            for position in tracked(range(request.count), request.progress, "decoding", "tok",
                                    request.count):
                token = request.decoder.decode(table)
                tail.append(token)
                trace.record(log2p, table, token)
                logits = stepper.step(token)
                if position + 1 < request.count:
                    table, log2p = base.model_distribution(logits)
        started = request.prefix is not None or request.context is not None
        return DecodeOutput(tail, trace, model.kv_tensor(stepper.cache),
                            request.count + (1 if started else 0))

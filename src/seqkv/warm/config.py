"""What a warm entry is coded with: the predictor, the quantizer and its bits, and the model.

Motivation: a warm entry (``seqkv.warm``) restores KV without a model forward, so its decoder
needs no model, only the KV geometry and the model's digest to refuse entries of another model.
Inside a serving engine there is no :class:`~seqkv.models.CausalLM` at all (the engine holds the
weights), so the codec is keyed by a :class:`WarmModel`, which an engine adapter builds from the
model folder and a Python user from a loaded model.

Invariants:
1. Only predictors that run no model forward are accepted (``none`` and previous-token delta):
   the warm tier's point is a load without a forward (enforced: ``DeltaConfigError``).
2. ``bits`` is a width the quantizer codes residuals at (enforced, as ``DeltaConfig`` does).
3. A ``WarmConfig`` has one byte encoding (``config_bytes``) that the entry header stores and
   that the connector's keys hash: two configs with equal bytes code alike (enforced).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from seqkv.delta.predictors import NoPrediction, PreviousToken
from seqkv.delta.predictors.previous_token import DeltaReference
from seqkv.delta.residual_coder import supported_bits
from seqkv.digests import Digest, model_digest
from seqkv.errors import DeltaConfigError
from seqkv.formats.framing import encode_varint
from seqkv.models.adapter import CausalLM
from seqkv.quantizers import QuantizerName
from seqkv.types import KVGeometry

QUANTIZER_IDS: tuple[QuantizerName, ...] = get_args(QuantizerName)
"""Stored quantizer ids: the position in this tuple (append only)."""
WarmPredictor = NoPrediction | PreviousToken
"""The predictors a warm entry can use: both need neither the model nor the tokens."""
_REFERENCE_IDS: tuple[DeltaReference, ...] = ("previous", "anchor")
DEFAULT_PREDICTOR = PreviousToken()
"""Previous-token delta, an anchor every 16 positions (a frozen value, shared)."""


@dataclass(frozen=True)
class WarmConfig:
    """Predictor, quantizer and bits of a warm entry.

    The default, previous-token delta with an anchor every 16 positions and 3-bit TurboQuant,
    is the point the connector's quality table measures (README, *vLLM connector*).

    >>> WarmConfig().label
    'previous-token (G=16) + turboquant_mse-3'
    >>> WarmConfig(NoPrediction(), "int8", 8).label
    'none + int8-8'
    """

    predictor: WarmPredictor = DEFAULT_PREDICTOR
    quantizer: QuantizerName = "turboquant_mse"
    bits: int = 3
    seed: int = 0
    """TurboQuant's rotation seed (stored; the decoder builds the same rotation)."""

    def __post_init__(self) -> None:
        if not isinstance(self.predictor, NoPrediction | PreviousToken):
            raise DeltaConfigError(
                f"the warm tier restores KV without a model forward; predictor "
                f"{self.predictor!r} needs one: use NoPrediction() or PreviousToken()"
            )
        if self.quantizer not in QUANTIZER_IDS:
            raise DeltaConfigError(
                f"unknown quantizer {self.quantizer!r}; expected one of {QUANTIZER_IDS}"
            )
        allowed = supported_bits(self.quantizer)
        if isinstance(self.bits, bool) or self.bits not in allowed:
            raise DeltaConfigError(
                f"quantizer {self.quantizer!r} codes residuals at {allowed} bits, got "
                f"{self.bits!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise DeltaConfigError(f"seed must be a non-negative int, got {self.seed!r}")

    @property
    def label(self) -> str:
        return f"{self.predictor.label} + {self.quantizer}-{self.bits}"

    def config_bytes(self) -> bytes:
        """The stored form: predictor id, group size, reference, quantizer id, bits, seed."""
        if isinstance(self.predictor, PreviousToken):
            predictor = bytes([1]) + encode_varint(self.predictor.group_size) + bytes(
                [_REFERENCE_IDS.index(self.predictor.reference)])
        else:
            predictor = bytes([0])
        return predictor + bytes([QUANTIZER_IDS.index(self.quantizer), self.bits]) + (
            encode_varint(self.seed))


def predictor_from_ids(kind: int, group_size: int, reference: int) -> WarmPredictor:
    """The predictor a header names (ids as ``config_bytes`` writes them)."""
    if kind == 0:
        return NoPrediction()
    return PreviousToken(group_size, _REFERENCE_IDS[reference])


@dataclass(frozen=True)
class WarmModel:
    """What the warm codec needs of a model: its digest and its KV geometry.

    >>> from seqkv.models import tiny_random_llama
    >>> WarmModel.of(tiny_random_llama()).geometry
    KVGeometry(layers=2, kv_heads=2, head_dim=16)
    """

    digest: Digest
    geometry: KVGeometry

    @classmethod
    def of(cls, model: CausalLM) -> WarmModel:
        """A loaded model's digest (config, weights, tokenizer) and geometry."""
        return cls(model_digest(model.identity), model.geometry)

"""What a warm entry is coded with, and the model: lossy (predictor, quantizer, bits) or exact.

Motivation: a warm entry (``seqkv.warm``) restores KV without a model forward, so its decoder
needs no model, only the KV geometry and the model's digest to refuse entries of another model.
Inside a serving engine there is no :class:`~seqkv.models.CausalLM` at all (the engine holds the
weights), so the codec is keyed by a :class:`WarmModel`, which an engine adapter builds from the
model folder and a Python user from a loaded model.

Two codings (``WarmMode``): ``lossy`` (:class:`WarmConfig`: a predictor and a quantizer, a few
bits per element, decoded to float32) and ``exact`` (:class:`ExactConfig`: the KV's own bits in
its own dtype, ``seqkv.warm.exact``), for users whose outputs must not change.

Invariants:
1. Only predictors that run no model forward are accepted (``none`` and previous-token delta):
   the warm tier's point is a load without a forward (enforced: ``DeltaConfigError``).
2. ``bits`` is a width the quantizer codes residuals at (enforced, as ``DeltaConfig`` does).
3. A ``WarmConfig`` or ``ExactConfig`` has one byte encoding (``config_bytes``) that the entry
   header stores and that the connector's keys hash: two configs with equal bytes code alike,
   and no lossy config's bytes equal an exact one's (enforced: the first byte is the coding,
   0 or 1 lossy, 2 exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from seqkv.delta.predictors import NoPrediction, PreviousToken
from seqkv.delta.predictors.previous_token import DeltaReference
from seqkv.delta.residual_coder import supported_bits
from seqkv.digests import Digest, model_digest
from seqkv.errors import DeltaConfigError
from seqkv.formats.warm_entry import (
    NO_PREDICTION,
    PREVIOUS_TOKEN,
    Coding,
    ExactCoding,
    LossyCoding,
    coding_bytes,
    header_error,
)
from seqkv.models.adapter import CausalLM
from seqkv.quantizers import QuantizerName
from seqkv.quantizers.bitpack import MAX_BITS
from seqkv.types import KVGeometry

QUANTIZER_IDS: tuple[QuantizerName, ...] = get_args(QuantizerName)
"""Stored quantizer ids: the position in this tuple (append only)."""
WarmPredictor = NoPrediction | PreviousToken
"""The predictors a warm entry can use: both need neither the model nor the tokens."""
_REFERENCE_IDS: tuple[DeltaReference, ...] = ("previous", "anchor")
DEFAULT_PREDICTOR = PreviousToken()
"""Previous-token delta, an anchor every 16 positions (a frozen value, shared)."""
WarmMode = Literal["exact", "lossy"]
WARM_MODES: tuple[WarmMode, ...] = get_args(WarmMode)
ExactDtype = Literal["float32", "bfloat16", "float16"]
EXACT_DTYPES: tuple[ExactDtype, ...] = get_args(ExactDtype)
"""Stored dtype ids: the position in this tuple (append only)."""


@dataclass(frozen=True)
class WarmConfig:
    """Predictor, quantizer and bits of a warm entry.

    The default, previous-token delta with an anchor every 16 positions and 3-bit TurboQuant,
    is the point the connector's quality table measures (docs/guides/vllm.md).

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

    def coding(self) -> LossyCoding:
        """The stored fields (``seqkv.formats.warm_entry``): ids for the predictor, reference
        and quantizer."""
        quantizer = QUANTIZER_IDS.index(self.quantizer)
        if isinstance(self.predictor, PreviousToken):
            return LossyCoding(PREVIOUS_TOKEN, self.predictor.group_size,
                               _REFERENCE_IDS.index(self.predictor.reference), quantizer,
                               self.bits, self.seed)
        return LossyCoding(NO_PREDICTION, 1, 0, quantizer, self.bits, self.seed)

    def config_bytes(self) -> bytes:
        """The stored form: predictor id, group size, reference, quantizer id, bits, seed."""
        return coding_bytes(self.coding())


@dataclass(frozen=True)
class ExactConfig:
    """Exact coding of KV held in ``dtype``: every value's bits come back unchanged.

    >>> ExactConfig("bfloat16").label, ExactConfig("bfloat16").config_bytes()
    ('exact bfloat16', b'\\x02\\x01')
    >>> ExactConfig.of(torch.float16)
    ExactConfig(dtype='float16')
    """

    dtype: ExactDtype = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in EXACT_DTYPES:
            raise DeltaConfigError(
                f"exact warm entries hold KV in {EXACT_DTYPES}, got {self.dtype!r}: run the "
                "engine's KV cache in one of them, or use the lossy mode"
            )

    @classmethod
    def of(cls, dtype: torch.dtype) -> ExactConfig:
        """The exact config of KV held in ``dtype`` (refused by name if it is not one of
        ``EXACT_DTYPES``)."""
        return cls(str(dtype).removeprefix("torch."))  # type: ignore[arg-type]

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype

    @property
    def label(self) -> str:
        return f"exact {self.dtype}"

    def coding(self) -> ExactCoding:
        """The stored field (``seqkv.formats.warm_entry``): the dtype's id."""
        return ExactCoding(EXACT_DTYPES.index(self.dtype))

    def config_bytes(self) -> bytes:
        """The stored form: the exact coding's id, then the dtype's id."""
        return coding_bytes(self.coding())


EntryConfig = WarmConfig | ExactConfig
"""What a warm entry can be coded with."""


def config_of(coding: Coding) -> EntryConfig:
    """The config an entry's stored coding fields name; ``CorruptFileError`` for an id this
    seqkv does not know or a config it cannot code."""
    if isinstance(coding, ExactCoding):
        if coding.dtype >= len(EXACT_DTYPES):
            raise header_error(f"names unknown dtype {coding.dtype}")
        return ExactConfig(EXACT_DTYPES[coding.dtype])
    if coding.quantizer >= len(QUANTIZER_IDS):
        raise header_error(f"names unknown quantizer {coding.quantizer}")
    quantizer = QUANTIZER_IDS[coding.quantizer]
    if coding.bits > MAX_BITS and quantizer not in ("int8", "fp8"):
        raise header_error(f"has bits {coding.bits} beyond {MAX_BITS}")
    predictor: WarmPredictor = NoPrediction()
    try:
        if coding.predictor == PREVIOUS_TOKEN:
            predictor = PreviousToken(coding.group_size, _REFERENCE_IDS[coding.reference])
        return WarmConfig(predictor, quantizer, coding.bits, coding.seed)
    except ValueError as error:
        raise header_error(f"names a config this seqkv cannot code: {error}") from None


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

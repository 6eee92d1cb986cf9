"""The 4-bit integer form of a model: GGUF Q4_1 weight blocks, exact fixed-point block scales.

``weights.py`` turns every linear layer into int8 rows with one scale per row: a one-row step
reads 135 MB of int8 weights on SmolLM2-135M, and that traffic bounds it. Here every linear
layer of the decoder is held as GGUF Q4_1 blocks, as llama.cpp stores them: along each row, 32
weights share an fp16 scale ``d`` and an fp16 minimum ``m``, and each weight is a nibble
``q`` in ``[0, 15]``, ``W[n, k] = d[n, b] * q[n, k] + m[n, b]`` with ``b = k // 32`` (20 bytes
per 32 weights: 66 MB for SmolLM2's decoder layers).

The block scale and minimum become exact fixed-point integers: every fp16 value is an integer
multiple of ``2**-24`` (the smallest subnormal), so ``D = d * 2**24`` and ``M = m * 2**24`` are
integers, exactly, and ``W[n, k] * 2**24 = D[n, b] * q[n, k] + M[n, b]`` with no rounding at all.
A row of activations ``x = q_x * 2**e`` (two 14-bit int8 planes, as in ``forward.py``) meets a
block through the exact int32 sum ``S = sum_k q_x[k] * q[n, k]`` over its 32 weights and the
activations' own block sum ``X = sum_k q_x[k]``; the layer's output is
``sum_b (D[n, b] * S[n, b] + M[n, b] * X[b])`` (int64, exact) times ``2**(e - 24)``.

Where the blocks come from: llama.cpp's reference Q4_1 quantizer (``quantize_row_q4_1_ref``,
gguf-py's ``Q4_1.quantize_blocks``), restated in ``q4_1_blocks`` with float32 elementwise
operations only (subtract, divide, multiply, add, truncate, each correctly rounded by IEEE-754)
plus exact maxima and minima and the correctly rounded float32 to float16 conversion. So the
blocks are a deterministic function of the model's float32 weights on every machine. For the
embedded SmolLM2-135M, whose float weights are its GGUF's Q4_1 blocks dequantized, requantizing
them gives back the GGUF's blocks bit for bit (all 155,520 rows of its 210 Q4_1 matrices;
``tests/test_integer_blocks.py`` checks it against the file): the 4-bit predictor computes with
the model's own blocks, as they are.

RMSNorm weights cannot fold into Q4_1 blocks (they vary within a block), so each norm keeps its
weight as an integer gain ``G[k] = round(g[k] * sqrt(K) * 2**frac)`` below ``2**16`` (float64
multiply and ``ldexp``, each correctly rounded), applied in the norm (``forward._norm``).

The output layer (SmolLM2: the tied Q8_0 embedding, 28.7 MB as int8 rows) is the int8
predictor's head, with the final norm folded in (``weights._int_linear``).

NOTE: why the head stays int8, measured on 256 tokens of each shipped text (prose, code, legal,
technical; torch statement): the Q4_1 decoder layers cost +0.14/-0.44/-0.06/+0.10 % of the
float model's cross-entropy with the int8 head, and +2.16/+4.01/+1.96/+0.61 % with the head
requantized to Q4_1 blocks (17.7 MB). So a one-row step reads 95.5 MB against the int8
predictor's 136.9 MB (0.698x), of which the head is 30% (``benchmarks/portable4.py``).

Invariants:
1. Every summed dimension ``K`` of a block layer is a multiple of ``BLOCK`` and at most
   ``weights.MAX_REDUCTION``, and ``K * 2**14 * max (15 |D| + |M|)`` stays below ``2**58``, so
   every int64 sum is exact, also at the 16 times it that native.c carries (enforced:
   ``UnsupportedWeightsError``).
2. ``|d|, |m| < 128`` so ``D`` and ``M`` fit int32 (native.c converts the fp16 values to them
   with exact IEEE conversions) (enforced).
3. ``BlockWeights.digest`` covers every integer tensor (dtype, shape, bytes), the geometry and
   ``BLOCK_PREDICTOR_VERSION``; it differs from every int8 predictor's digest (enforced by
   construction: another version string leads the hashed header).
4. Building reads the model and never mutates it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from seqkv.models.adapter import CausalLM
from seqkv.models.integer.weights import (
    HIDDEN_FRAC,
    MAX_REDUCTION,
    QKV_FRAC,
    Geometry,
    IntegerConfig,
    IntLinear,
    PredictorDigest,
    UnsupportedWeightsError,
    _biases,
    _embedding,
    _float32,
    _geometry,
    _int_linear,
)

# NOTE: bump on any change to the 4-bit predictor's arithmetic (blocks, gains, head); the int8
# predictor's PREDICTOR_VERSION covers what the two share (the forward's other steps, tables).
BLOCK_PREDICTOR_VERSION = 1
BLOCK = 32  # weights per Q4_1 block, along K
NIBBLE_LEVELS = 15
SCALE_FRAC = 24  # D = d * 2**24 and M = m * 2**24 are integers for every fp16 d, m
_SCALE_LIMIT = 1 << 31  # |D|, |M| < 2**31: |d|, |m| < 128
GAIN_BITS = 16  # |G| <= 2**16: |q| < 2**16 times G times the rsqrt mantissa (<= 2**30) < 2**62
# NOTE: native.c sums 16 times each block's products (the high nibbles enter its products in
# place), so the exact sums stay below 2**58 for 16 times them to fit int64 with room.
_SUM_LIMIT = 1 << 58
ACTIVATION_LIMIT = 1 << 14  # |q_x| < 2**14 (forward.ACTIVATION_BITS)


def q4_1_blocks(weight: npt.NDArray[np.float32]
                ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float16], npt.NDArray[np.float16]]:
    """llama.cpp's reference Q4_1 quantization of float32 ``weight [N, K]`` (``K`` a multiple
    of 32): nibbles ``q [N, K]`` (uint8, 0..15), scales ``d`` and minima ``m`` ``[N, K // 32]``
    (float16), with ``weight ~= d * q + m`` block by block.

    ``d = (max - min) / 15`` and ``q = trunc((w - min) * (1 / d) + 0.5)`` in float32, as
    gguf-py's ``Q4_1.quantize_blocks``; ``d`` and ``min`` are then rounded to float16.

    >>> w = np.arange(64, dtype=np.float32).reshape(1, 64) / 8
    >>> q, d, m = q4_1_blocks(w)
    >>> q[0, :4].tolist(), d.tolist(), m.tolist()
    ([0, 0, 1, 1], [[0.25830078125, 0.25830078125]], [[0.0, 4.0]])
    """
    rows, k = weight.shape
    blocks = np.ascontiguousarray(weight, dtype=np.float32).reshape(rows, k // BLOCK, BLOCK)
    top = blocks.max(axis=-1, keepdims=True)
    low = blocks.min(axis=-1, keepdims=True)
    d = (top - low) / np.float32(NIBBLE_LEVELS)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    scaled = (blocks - low) * inverse + np.float32(0.5)
    q = np.trunc(scaled).astype(np.uint8).clip(0, NIBBLE_LEVELS)
    return (q.reshape(rows, k), d[..., 0].astype(np.float16), low[..., 0].astype(np.float16))


@dataclass(frozen=True, eq=False)
class BlockLinear:
    """One linear layer as Q4_1 blocks in integers:
    ``W[n, k] * 2**24 = scale[n, k // 32] * quants[n, k] + minimum[n, k // 32]``."""

    quants: torch.Tensor  # int8 [N, K], 0..15
    scale: torch.Tensor  # int64 [N, K // 32]: D = d * 2**24
    minimum: torch.Tensor  # int64 [N, K // 32]: M = m * 2**24
    bias: torch.Tensor | None  # int64 [N] at the layer's output fixed point

    @property
    def out_features(self) -> int:
        return int(self.quants.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.quants.shape[1])

    def rows(self, start: int, end: int) -> BlockLinear:
        """Output rows ``start .. end - 1`` (views)."""
        return BlockLinear(self.quants[start:end], self.scale[start:end],
                           self.minimum[start:end],
                           None if self.bias is None else self.bias[start:end])

    def halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``d`` and ``m`` as float16 ``[N, K // 32]`` (exact: they were float16)."""
        unit = 2.0**-SCALE_FRAC
        return ((self.scale.double() * unit).half(), (self.minimum.double() * unit).half())


@dataclass(frozen=True, eq=False)
class IntGain:
    """An RMSNorm weight times ``sqrt(K)`` as ``values * 2**-frac`` (``|values| <= 2**16``)."""

    values: torch.Tensor  # int64 [K]
    frac: int


@dataclass(frozen=True, eq=False)
class BlockLayer:
    """One decoder layer: Q4_1 linear layers, the two norms' gains."""

    qkv: BlockLinear  # rows: q heads, then k heads, then v heads
    o: BlockLinear
    gate_up: BlockLinear  # rows: gate, then up
    down: BlockLinear
    attention_gain: IntGain  # input_layernorm
    mlp_gain: IntGain  # post_attention_layernorm


@dataclass(frozen=True, eq=False)
class BlockWeights:
    """A whole model with Q4_1 decoder layers, and its digest (``IntegerWeights``' sibling: the
    integer forward takes either)."""

    geometry: Geometry
    config: IntegerConfig  # the activation planes the forward uses (always two here)
    embedding: torch.Tensor  # int32 [V, hidden] at 2**-embedding_frac
    embedding_frac: int
    layers: tuple[BlockLayer, ...]
    head: IntLinear  # final norm folded in (int8 rows)

    @classmethod
    def from_model(cls, model: CausalLM) -> BlockWeights:
        """The Q4_1 integer form of ``model`` (a ``CausalLM`` of a supported family)."""
        geometry = _geometry(model)
        if any(k % BLOCK for k in (geometry.hidden, geometry.intermediate,
                                   geometry.heads * geometry.head_dim)):
            raise UnsupportedWeightsError(
                f"4-bit blocks need every summed dimension to be a multiple of {BLOCK}: "
                "use the int8 predictor (portable) for this model")
        backbone = model.model.model
        layers = []
        for layer in backbone.layers:
            attention, mlp = layer.self_attn, layer.mlp
            qkv = [attention.q_proj, attention.k_proj, attention.v_proj]
            layers.append(BlockLayer(
                qkv=block_linear(torch.cat([_float32(p.weight) for p in qkv]),
                                 _biases(qkv, QKV_FRAC)),
                o=block_linear(_float32(attention.o_proj.weight),
                               _biases([attention.o_proj], HIDDEN_FRAC)),
                gate_up=block_linear(torch.cat([_float32(mlp.gate_proj.weight),
                                                _float32(mlp.up_proj.weight)]), None),
                down=block_linear(_float32(mlp.down_proj.weight), None),
                attention_gain=int_gain(_float32(layer.input_layernorm.weight)),
                mlp_gain=int_gain(_float32(layer.post_attention_layernorm.weight)),
            ))
        head = _int_linear(_float32(model.model.lm_head.weight), 1,
                           norm=_float32(backbone.norm.weight), bias=None)
        embedding, embedding_frac = _embedding(_float32(backbone.embed_tokens.weight))
        return cls(geometry, IntegerConfig(), embedding, embedding_frac, tuple(layers), head)

    def to(self, device: torch.device | str) -> BlockWeights:
        """The same integers on ``device`` (the digest does not change)."""
        def move(linear: BlockLinear) -> BlockLinear:
            return BlockLinear(linear.quants.to(device), linear.scale.to(device),
                               linear.minimum.to(device),
                               None if linear.bias is None else linear.bias.to(device))

        def gain(value: IntGain) -> IntGain:
            return IntGain(value.values.to(device), value.frac)

        layers = tuple(BlockLayer(move(layer.qkv), move(layer.o), move(layer.gate_up),
                                  move(layer.down), gain(layer.attention_gain),
                                  gain(layer.mlp_gain)) for layer in self.layers)
        head = replace(self.head, weight=self.head.weight.to(device),
                       scale=self.head.scale.to(device))
        return replace(self, embedding=self.embedding.to(device), layers=layers, head=head)

    def digest(self) -> PredictorDigest:
        """SHA-256 over the version, geometry and every integer tensor."""
        hasher = hashlib.sha256()
        header: dict[str, Any] = {"predictor": "q4_1 blocks", "version": BLOCK_PREDICTOR_VERSION,
                                  "geometry": asdict(self.geometry),
                                  "config": asdict(self.config),
                                  "embedding_frac": self.embedding_frac, "block": BLOCK}
        hasher.update(json.dumps(header, sort_keys=True).encode())
        for name, tensor in self._named_tensors():
            hasher.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            hasher.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                          .numpy().tobytes())
        return PredictorDigest(hasher.hexdigest())

    def _named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        named = [("embedding", self.embedding)]
        for i, layer in enumerate(self.layers):
            for part in ("qkv", "o", "gate_up", "down"):
                linear: BlockLinear = getattr(layer, part)
                named += [(f"layers.{i}.{part}.quants", linear.quants),
                          (f"layers.{i}.{part}.scale", linear.scale),
                          (f"layers.{i}.{part}.minimum", linear.minimum)]
                if linear.bias is not None:
                    named.append((f"layers.{i}.{part}.bias", linear.bias))
            for part in ("attention_gain", "mlp_gain"):
                gain: IntGain = getattr(layer, part)
                named += [(f"layers.{i}.{part}", gain.values),
                          (f"layers.{i}.{part}.frac", torch.tensor([gain.frac]))]
        named += [("head.weight", self.head.weight), ("head.scale", self.head.scale),
                  ("head.scale_bits", torch.tensor([self.head.scale_bits]))]
        return named


def block_weights(model: CausalLM) -> BlockWeights:
    """The model's Q4_1 integer form, built once per model (kept on the model, whose weights
    ``CausalLM`` never changes)."""
    cached = getattr(model, "_seqkv_block_weights", None)
    if not isinstance(cached, BlockWeights):
        cached = BlockWeights.from_model(model)
        setattr(model, "_seqkv_block_weights", cached)  # noqa: B010 (an attribute CausalLM lacks)
    return cached


def block_linear(weight: torch.Tensor, bias: npt.NDArray[np.int64] | None) -> BlockLinear:
    """``weight [N, K]`` (float32) as Q4_1 blocks in integers (invariants 1 and 2)."""
    _, k = weight.shape
    if k % BLOCK or k > MAX_REDUCTION:
        raise UnsupportedWeightsError(
            f"a summed dimension of {k} is not a multiple of {BLOCK} at most {MAX_REDUCTION}")
    if not bool(torch.isfinite(weight).all()):
        raise UnsupportedWeightsError("the model's weights are not finite")
    quants, d, m = q4_1_blocks(weight.numpy())
    # every float16 is an integer multiple of 2**-24: the products are exact in float64
    scale = np.ldexp(d.astype(np.float64), SCALE_FRAC).astype(np.int64)
    minimum = np.ldexp(m.astype(np.float64), SCALE_FRAC).astype(np.int64)
    if max(int(np.abs(scale).max()), int(np.abs(minimum).max())) >= _SCALE_LIMIT:
        raise UnsupportedWeightsError("a Q4_1 block scale or minimum is 128 or more: too large "
                                      "for the 4-bit predictor's int32 fixed point")
    weight_bound = int((NIBBLE_LEVELS * np.abs(scale) + np.abs(minimum)).max())
    if k * ACTIVATION_LIMIT * weight_bound >= _SUM_LIMIT:
        raise UnsupportedWeightsError("Q4_1 blocks this large could overflow the 4-bit "
                                      "predictor's int64 sums")
    return BlockLinear(torch.from_numpy(quants.astype(np.int8)), torch.from_numpy(scale),
                       torch.from_numpy(minimum),
                       None if bias is None else torch.from_numpy(bias))


def int_gain(weight: torch.Tensor) -> IntGain:
    """An RMSNorm weight ``g [K]`` times ``sqrt(K)`` in fixed point below ``2**16``: float64
    multiply and ``ldexp``, each correctly rounded, then ``rint``."""
    (k,) = weight.shape
    real = weight.to(torch.float64).numpy() * math.sqrt(k)
    top = float(np.abs(real).max())
    if not math.isfinite(top):
        raise UnsupportedWeightsError("the model's norm weights are not finite")
    frac = GAIN_BITS - (math.frexp(top)[1] if top > 0 else 0)
    values = np.rint(np.ldexp(real, frac)).astype(np.int64)
    return IntGain(torch.from_numpy(values), frac)

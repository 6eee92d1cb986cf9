"""The integer form of a Llama-family model: int8 weight planes, fixed-point scales, a digest.

The integer forward (``forward.py``) multiplies int8 activation planes by int8 weight planes with
``torch._int_mm``, whose int32 sums are exact, so it needs every linear layer as

* integer weights ``q[n, k]`` in ``[-L, L]`` per output row ``n`` (``L = 127`` for one int8
  plane, ``16383`` for two: ``q = 128 * hi + lo``, ``hi`` signed, ``lo`` in ``[0, 127]``),
  stored as ``[planes * N, K]`` int8 so that ``weight.t()`` is the ``[K, planes * N]`` operand;
* a per-row scale mantissa ``scale[n] < 2**24`` (``2**17`` for two planes) and one exponent per
  matrix, ``W[n, k] ~= q[n, k] * scale[n] * 2**-scale_bits``.

RMSNorm weights are folded into the following linear layers (``W[n, k] * g[k]``), and so is the
``sqrt(K)`` of the RMS (the forward divides by ``sqrt(sum of squares)``), so a norm costs no
elementwise multiply at run time.

NOTE: one int8 plane per weight row, measured on the 4 shipped texts (256 tokens each, float
simulation of per-row quantization, SmolLM2-135M): int8 rows cost -0.2/+0.8/+0.1/+0.2 % of
cross-entropy on prose/code/legal/technical (with the norm folded in: -0.2/+0.5/-0.2/+0.6 %),
two planes (15 bits) cost nothing measurable (+0.00 %), but a batch-1 step reads every weight
byte, so one-row products over two-plane matrices take more than twice the time of one plane
(int8). The default is one
plane; ``IntegerConfig(weight_planes=2)`` builds the 15-bit predictor (benchmarked by
``benchmarks/integer_predictor.py --weight-planes 2``).

Every integer here is a deterministic function of the model's float32 weights: the per-row
quantization uses only IEEE-754 elementwise operations (float32 multiply, divide, round;
float64 sqrt and multiply for the per-row scales), each correctly rounded, plus exact maxima, so
every conforming machine computes the same integers (the weights are built on the CPU). For the
embedded model the Q8_0 embedding rows are exact in the ``2**-24`` fixed point used for the
residual stream.

Invariants:
1. Supported: ``model_type`` in ``SUPPORTED_MODEL_TYPES`` with SiLU MLPs, RMSNorm, default
   rotary embeddings, no MLP biases; attention biases (Qwen2's q/k/v, Llama's
   ``attention_bias``) are kept. Anything else raises UnsupportedModelError (enforced).
2. Every summed dimension ``K`` is at most ``MAX_REDUCTION`` so that the int32 plane products
   and the int64 scaled sums cannot overflow (enforced).
3. ``IntegerWeights.digest`` covers every integer tensor (dtype, shape, bytes), the geometry,
   the config and ``PREDICTOR_VERSION``: equal digests compute equal logits (enforced by
   construction).
4. Building reads the model and never mutates it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from typing import Any, Literal, NewType

import numpy as np
import numpy.typing as npt
import torch

from seqkv.errors import UnsupportedModelError
from seqkv.models.adapter import CausalLM

PredictorDigest = NewType("PredictorDigest", str)
WeightPlanes = Literal[1, 2]
ActivationPlanes = Literal[1, 2]

# NOTE: bump on any change to the arithmetic of the integer forward, its fixed-point tables or
# the coder table (table.py): the digest then changes, so a file coded by an older predictor is
# refused rather than decoded wrongly.
PREDICTOR_VERSION = 1
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2"})

PLANE_BITS = 7  # a plane below the top one holds 7 unsigned bits, the top one is signed int8
HIDDEN_FRAC = 24  # the residual stream is int64 at 2**-24 (exact for fp16-scaled Q8_0 rows)
QKV_FRAC = 20  # queries, keys and values at 2**-20 (SmolLM2: |q|, |k| <= 21, |v| <= 14)
# NOTE: K * (2**14 activation) * (2**7 weight plane) < 2**31 needs K < 2**10 per int32 plane
# product only when one plane holds 14 bits; here every int8 x int8 plane product is below
# 2**14, so an int32 sum over K <= 2**17 is exact. The binding limit is the int64 scaling:
# K * 2**14 * 2**(7 * planes) * scale < 2**58, with scale < 2**(24 - 7 * (planes - 1)).
MAX_REDUCTION = 1 << 13
_SCALE_MANTISSA_BITS = {1: 24, 2: 17}
_LEVELS = {1: 127, 2: (1 << 14) - 1}


class UnsupportedWeightsError(UnsupportedModelError):
    """The model's weights or geometry fall outside what the integer forward can hold."""


@dataclass(frozen=True)
class IntegerConfig:
    """How a model is turned into integers (part of the digest)."""

    # NOTE: 1 plane is the measured choice, see the module docstring.
    weight_planes: WeightPlanes = 1
    # NOTE: 2 planes (14-bit activations) is the measured choice, see forward.py; 1 plane
    # (int8 activations into every linear layer) is the faster, costlier alternative the
    # benchmark reports.
    activation_planes: ActivationPlanes = 2


@dataclass(frozen=True, eq=False)
class IntLinear:
    """One linear layer in integers: ``W[n, k] ~= q[n, k] * scale[n] * 2**-scale_bits``."""

    weight: torch.Tensor  # int8 [planes * N, K]: plane p holds rows p*N .. p*N + N - 1
    scale: torch.Tensor  # int64 [N]
    scale_bits: int
    planes: int
    bias: torch.Tensor | None  # int64 [N] at the layer's output fixed point

    @property
    def out_features(self) -> int:
        return int(self.scale.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])


@dataclass(frozen=True, eq=False)
class IntLayer:
    """One decoder layer: norms folded into ``qkv`` and ``gate_up``."""

    qkv: IntLinear  # rows: q heads, then k heads, then v heads
    o: IntLinear
    gate_up: IntLinear  # rows: gate, then up
    down: IntLinear


@dataclass(frozen=True)
class Geometry:
    """The shapes and constants of the model (part of the digest)."""

    model_type: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    max_positions: int
    rope_theta: float
    # sqrt(K) folds into the weights; the forward adds eps * K * 2**(2 * HIDDEN_FRAC) to the
    # sum of squares of the residual's integers, shifted by twice the row's shift.
    norm_eps_term: int


@dataclass(frozen=True, eq=False)
class IntegerWeights:
    """A whole model in integers, and its digest."""

    geometry: Geometry
    config: IntegerConfig
    embedding: torch.Tensor  # int32 [V, hidden] at 2**-embedding_frac
    embedding_frac: int
    layers: tuple[IntLayer, ...]
    head: IntLinear  # final norm folded in

    @classmethod
    def from_model(cls, model: CausalLM, config: IntegerConfig | None = None) -> IntegerWeights:
        """The integer form of ``model`` (a ``CausalLM`` of a supported family)."""
        config = IntegerConfig() if config is None else config
        geometry = _geometry(model)
        planes = config.weight_planes
        backbone = model.model.model
        layers = []
        for layer in backbone.layers:
            attention, mlp = layer.self_attn, layer.mlp
            g1 = _float32(layer.input_layernorm.weight)
            g2 = _float32(layer.post_attention_layernorm.weight)
            qkv = [attention.q_proj, attention.k_proj, attention.v_proj]
            layers.append(IntLayer(
                qkv=_int_linear(torch.cat([_float32(p.weight) for p in qkv]), planes,
                                norm=g1, bias=_biases(qkv, QKV_FRAC)),
                o=_int_linear(_float32(attention.o_proj.weight), planes, norm=None,
                              bias=_biases([attention.o_proj], HIDDEN_FRAC)),
                gate_up=_int_linear(torch.cat([_float32(mlp.gate_proj.weight),
                                               _float32(mlp.up_proj.weight)]),
                                    planes, norm=g2, bias=None),
                down=_int_linear(_float32(mlp.down_proj.weight), planes, norm=None, bias=None),
            ))
        head_weight = model.model.lm_head.weight
        head = _int_linear(_float32(head_weight), planes, norm=_float32(backbone.norm.weight),
                           bias=None)
        embedding, embedding_frac = _embedding(_float32(backbone.embed_tokens.weight))
        return cls(geometry, config, embedding, embedding_frac, tuple(layers), head)

    def to(self, device: torch.device | str) -> IntegerWeights:
        """The same integers on ``device`` (the forward runs where its weights are; the digest
        does not change)."""
        def move(linear: IntLinear) -> IntLinear:
            return replace(linear, weight=linear.weight.to(device), scale=linear.scale.to(device),
                           bias=None if linear.bias is None else linear.bias.to(device))

        layers = tuple(IntLayer(move(layer.qkv), move(layer.o), move(layer.gate_up),
                                move(layer.down)) for layer in self.layers)
        return replace(self, embedding=self.embedding.to(device), layers=layers,
                       head=move(self.head))

    def digest(self) -> PredictorDigest:
        """SHA-256 over the version, geometry, config and every integer tensor."""
        hasher = hashlib.sha256()
        header = {"version": PREDICTOR_VERSION, "geometry": asdict(self.geometry),
                  "config": asdict(self.config), "embedding_frac": self.embedding_frac}
        hasher.update(json.dumps(header, sort_keys=True).encode())
        for name, tensor in self._named_tensors():
            hasher.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            hasher.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                          .numpy().tobytes())
        return PredictorDigest(hasher.hexdigest())

    def _named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        named = [("embedding", self.embedding)]
        linears = [(f"layers.{i}.{part}", getattr(layer, part))
                   for i, layer in enumerate(self.layers)
                   for part in ("qkv", "o", "gate_up", "down")]
        for name, linear in [*linears, ("head", self.head)]:
            named.append((f"{name}.weight", linear.weight))
            named.append((f"{name}.scale", linear.scale))
            named.append((f"{name}.scale_bits", torch.tensor([linear.scale_bits])))
            if linear.bias is not None:
                named.append((f"{name}.bias", linear.bias))
        return named


def integer_weights(model: CausalLM, config: IntegerConfig | None = None) -> IntegerWeights:
    """The model's integer form, built once per model and config (kept on the model, whose
    weights ``CausalLM`` never changes)."""
    config = IntegerConfig() if config is None else config
    cache = getattr(model, "_seqkv_integer_weights", None)
    if not isinstance(cache, dict):
        cache = {}
        setattr(model, "_seqkv_integer_weights", cache)  # noqa: B010 (an attribute CausalLM lacks)
    weights = cache.get(config)
    if not isinstance(weights, IntegerWeights):
        weights = IntegerWeights.from_model(model, config)
        cache[config] = weights
    return weights


def _geometry(model: CausalLM) -> Geometry:
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"the integer predictor supports {sorted(SUPPORTED_MODEL_TYPES)} models, not "
            f"{model_type!r}: use the float predictor for this model")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"the integer predictor needs a SiLU MLP, not {act!r}")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedModelError("the integer predictor does not support MLP biases")
    if getattr(config, "use_sliding_window", False):
        raise UnsupportedModelError("the integer predictor does not support sliding windows")
    rope = _rope_parameters(config)
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedModelError(
            f"the integer predictor supports default rotary embeddings, not "
            f"{rope.get('rope_type')!r}")
    hidden = int(config.hidden_size)
    intermediate = int(config.intermediate_size)
    if max(hidden, intermediate, model.head_dim * int(config.num_attention_heads)) > \
            MAX_REDUCTION:
        raise UnsupportedWeightsError(
            f"a summed dimension exceeds {MAX_REDUCTION}: the integer sums could overflow")
    eps = Fraction(float(config.rms_norm_eps))
    eps_term = round(eps * hidden * (1 << (2 * HIDDEN_FRAC)))
    return Geometry(
        model_type=str(model_type), vocab=model.vocab_size, hidden=hidden,
        intermediate=intermediate, layers=model.num_layers,
        heads=int(config.num_attention_heads), kv_heads=model.kv_heads,
        head_dim=model.head_dim, max_positions=int(config.max_position_embeddings),
        rope_theta=float(rope["rope_theta"]), norm_eps_term=eps_term)


def _rope_parameters(config: Any) -> dict[str, Any]:
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return dict(parameters)
    scaling = getattr(config, "rope_scaling", None) or {}
    return {"rope_type": scaling.get("rope_type", scaling.get("type", "default")),
            "rope_theta": getattr(config, "rope_theta", 10000.0)}


def _float32(parameter: torch.Tensor) -> torch.Tensor:
    return parameter.detach().to("cpu", torch.float32)


def _biases(projections: list[Any], frac: int) -> npt.NDArray[np.int64] | None:
    """The projections' biases, concatenated, as int64 at ``2**-frac`` (None if none has one)."""
    biases = [p.bias for p in projections]
    if all(b is None for b in biases):
        return None
    real = np.concatenate([np.zeros(p.out_features) if b is None
                           else b.detach().to("cpu", torch.float64).numpy()
                           for p, b in zip(projections, biases, strict=True)])
    if not np.all(np.abs(real) < 2.0 ** (62 - frac)):
        raise UnsupportedWeightsError("a bias is too large (or not finite) for fixed point")
    return np.asarray(np.rint(np.ldexp(real, frac)), dtype=np.int64)


def _int_linear(weight: torch.Tensor, planes: int, norm: torch.Tensor | None,
                bias: npt.NDArray[np.int64] | None) -> IntLinear:
    """Per-row fixed point of ``weight * norm`` (norm weights along K), with sqrt(K) folded into
    the scales of norm-fed layers.

    float32 elementwise operations (multiply, divide, round: each correctly rounded by IEEE-754)
    on the float32 weights, then float64 for the ``[N]`` scales.
    """
    _, k = weight.shape
    if k > MAX_REDUCTION:
        raise UnsupportedWeightsError(f"a summed dimension of {k} exceeds {MAX_REDUCTION}")
    folded = weight if norm is None else weight * norm[None, :]  # [N, K]
    levels = _LEVELS[planes]
    step = torch.linalg.vector_norm(folded, ord=math.inf, dim=1) / levels  # [N]: max |row|
    if not bool(torch.isfinite(step).all()):
        raise UnsupportedWeightsError("the model's weights are not finite")
    safe = torch.where(step > 0, step, torch.ones_like(step))
    q = (folded / safe[:, None]).round_().clamp_(-levels, levels).to(torch.int16)
    row_scale = step.to(torch.float64).numpy() * (math.sqrt(k) if norm is not None else 1.0)
    top = float(row_scale.max())
    exponent = math.frexp(top)[1] if top > 0 else 0
    scale_bits = _SCALE_MANTISSA_BITS[planes] - exponent
    scale = np.rint(np.ldexp(row_scale, scale_bits)).astype(np.int64)
    stacked = [q] if planes == 1 else [q >> PLANE_BITS, q & ((1 << PLANE_BITS) - 1)]
    return IntLinear(
        weight=torch.cat(stacked).to(torch.int8).contiguous(),
        scale=torch.from_numpy(scale), scale_bits=scale_bits, planes=planes,
        bias=None if bias is None else torch.from_numpy(bias))


def _embedding(table: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The embedding rows as int32 at ``2**-frac``, with ``frac <= HIDDEN_FRAC`` as large as
    int32 allows (exact for the embedded model's Q8_0 rows at 2**-24)."""
    top = float(table.abs().max())
    if not math.isfinite(top):
        raise UnsupportedWeightsError("the model's embedding is not finite")
    frac = min(HIDDEN_FRAC, 30 - (math.frexp(top)[1] if top > 0 else 0))
    # scaling by a power of two is exact; round is exact
    return torch.round(table * float(1 << frac)).to(torch.int32), frac

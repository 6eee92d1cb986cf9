"""Per-vector against sequential KV-cache bits per token position: the paper's headline ratio.

Paper: "Sequential KV Cache Compression via Probabilistic Language Tries: Beyond the Per-Vector
Shannon Limit" (arXiv 2604.15356). It sets a per-vector quantizer (TurboQuant, 3 bits per
component) against the sequential limit (about 4.3 bits per token, log2 of perplexity):

    per-vector bits per token position = 2 x layers x kv_heads x head_dim x bits_per_component
    ratio = per-vector bits per token position / (sequential bits per token position x overhead)

The factor 2 counts keys and values. With 80 layers, 64 heads, head dim 128 and 3 bits this is
3,932,160 bits, and 3,932,160 / 4.3 = 914,455.8 (the paper's "~914,000x"); "even 1000x above the
entropy floor" (overhead 1000) it is 914.5 ("~914x").

Invariants:

1. (enforced) A ``KVGeometry`` has positive integer layers, KV heads and head dim.
2. (enforced) Bits per component, sequential bits and overhead are positive exact rationals
   (``4.3`` is ``43/10``), so every ratio here is an exact ``sympy.Rational``.
3. (checked) Each numeric function instantiates the symbolic expression by substitution, so the
   formula above, the sympy expression and the number cannot drift apart.
4. (assumed) Every layer stores K and V for every KV head at every position (no cross-layer KV
   sharing, sliding window or latent KV); for models that do otherwise the count overstates.

What the paper gets wrong:

- Units. The "per-vector Shannon limit" is a rate per KV *component* (3 bits); the sequential
  limit is a rate per token *position* (4.3 bits for all layers and heads together). Readers of
  the full paper report that its ratio sets one against the other. The 914,000x figure is right
  only with both sides per token position, which is how this module states it; per component,
  the sequential side is 4.3 / components_per_token (``sequential_bits_per_component``).
- Heads. A Llama-style 70B model has 64 query heads but 8 KV heads (grouped-query attention), and
  the cache stores the 8. The paper's 64 overstates the per-vector side, hence the ratio, 8x:
  with 8 KV heads it is 114,307x (114x with the 1000x overhead).
- The 4.3 bits is a cross-entropy measured on data, not an entropy (``seqkv.proofs.perplexity``).
- "The ratio improves with context length" follows only if the sequential bits per position fall
  with context (non-increasing conditional entropy, true of a stationary source); the per-vector
  side is constant per position, and the ratio decreases in h (``ratio_decreases_in_h``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import sympy

from seqkv.types import KVGeometry

from ._exact import (
    ExactLike,
    as_float,
    as_int,
    as_rational,
    exact_positive,
    instantiate,
)

LAYERS = sympy.Symbol("L", integer=True, positive=True)
KV_HEADS = sympy.Symbol("H_kv", integer=True, positive=True)
HEAD_DIM = sympy.Symbol("d_head", integer=True, positive=True)
BITS_PER_COMPONENT = sympy.Symbol("b", positive=True)
SEQUENTIAL_BITS = sympy.Symbol("h", positive=True)
OVERHEAD = sympy.Symbol("c", positive=True)
PER_VECTOR_BITS = sympy.Symbol("B_pv", positive=True)

FP16_BITS_PER_COMPONENT = 16
PAPER_BITS_PER_COMPONENT = 3
"""TurboQuant at 3 bits per component, the paper's per-vector baseline."""
PAPER_SEQUENTIAL_BITS = Fraction(43, 10)
"""The paper's sequential bits per token position (log2 perplexity ~ 4.3, perplexity ~ 19.7)."""
PAPER_OVERHEAD = 1000
"""The paper's "even 1000x above the entropy floor"."""
PAPER_RATIO = 914_000
PAPER_RATIO_WITH_OVERHEAD = 914


PAPER_70B = KVGeometry(layers=80, kv_heads=64, head_dim=128)
"""The paper's 70B geometry: 64 heads taken as KV heads."""
LLAMA_70B_GQA = KVGeometry(layers=80, kv_heads=8, head_dim=128)
"""A Llama-style 70B model as it is: 64 query heads sharing 8 KV heads."""
SMOLLM2_135M = KVGeometry(layers=30, kv_heads=3, head_dim=64)
"""SmolLM2-135M, the model this project measures on."""


@dataclass(frozen=True, slots=True)
class RatioResult:
    """One instance of the ratio, with every input kept so a report can show its derivation."""

    geometry: KVGeometry
    bits_per_component: sympy.Rational
    sequential_bits: sympy.Rational
    overhead: sympy.Rational
    per_vector_bits: sympy.Rational
    ratio: sympy.Rational

    @property
    def ratio_float(self) -> float:
        """The ratio as a float."""
        return as_float(self.ratio)


def components_per_token_expr() -> sympy.Expr:
    """KV components stored per token position: 2 (K and V) x layers x KV heads x head dim.

    >>> components_per_token_expr()
    2*H_kv*L*d_head
    """
    return 2 * LAYERS * KV_HEADS * HEAD_DIM


def per_vector_bits_expr() -> sympy.Expr:
    """Bits per token position of a per-vector quantizer at ``b`` bits per component.

    >>> per_vector_bits_expr()
    2*H_kv*L*b*d_head
    """
    return components_per_token_expr() * BITS_PER_COMPONENT


def ratio_of_bits_expr() -> sympy.Expr:
    """Per-vector bits ``B_pv`` over sequential bits ``h`` times overhead ``c``.

    >>> ratio_of_bits_expr()
    B_pv/(c*h)
    """
    return PER_VECTOR_BITS / (SEQUENTIAL_BITS * OVERHEAD)


def ratio_expr() -> sympy.Expr:
    """``ratio_of_bits_expr`` with the per-vector bits written out over the geometry.

    >>> ratio_expr()
    2*H_kv*L*b*d_head/(c*h)
    """
    return ratio_of_bits_expr().subs(PER_VECTOR_BITS, per_vector_bits_expr())


def ratio_decreases_in_h() -> bool:
    """Whether d(ratio)/dh < 0 for all positive inputs, so falling h along context raises the ratio.

    >>> ratio_decreases_in_h()
    True
    """
    return bool(sympy.diff(ratio_of_bits_expr(), SEQUENTIAL_BITS).is_negative)


def _geometry_subs(geometry: KVGeometry) -> dict[sympy.Symbol, int]:
    return {LAYERS: geometry.layers, KV_HEADS: geometry.kv_heads, HEAD_DIM: geometry.head_dim}


def components_per_token(geometry: KVGeometry) -> int:
    """KV components per token position for ``geometry``.

    >>> components_per_token(SMOLLM2_135M)
    11520
    """
    return as_int(instantiate(components_per_token_expr(), _geometry_subs(geometry)))


def per_vector_bits_per_token(
    geometry: KVGeometry, bits_per_component: ExactLike
) -> sympy.Rational:
    """Bits per token position at ``bits_per_component`` bits for every KV component.

    >>> per_vector_bits_per_token(PAPER_70B, 3)
    3932160
    >>> per_vector_bits_per_token(SMOLLM2_135M, 3)
    34560
    """
    subs: dict[sympy.Symbol, object] = dict(_geometry_subs(geometry))
    subs[BITS_PER_COMPONENT] = exact_positive(bits_per_component, name="bits_per_component")
    return as_rational(instantiate(per_vector_bits_expr(), subs))


def fp16_bits_per_token(geometry: KVGeometry) -> int:
    """Bits per token position of an uncompressed fp16 KV cache.

    >>> fp16_bits_per_token(SMOLLM2_135M)
    184320
    """
    return as_int(per_vector_bits_per_token(geometry, FP16_BITS_PER_COMPONENT))


def ratio(
    per_vector_bits: ExactLike, sequential_bits: ExactLike, overhead: ExactLike = 1
) -> sympy.Rational:
    """Per-vector bits over (sequential bits x overhead), both per token position.

    >>> ratio(3932160, 4.3)
    39321600/43
    >>> ratio(3932160, 4.3, overhead=1000)
    196608/215
    """
    subs = {
        PER_VECTOR_BITS: exact_positive(per_vector_bits, name="per_vector_bits"),
        SEQUENTIAL_BITS: exact_positive(sequential_bits, name="sequential_bits"),
        OVERHEAD: exact_positive(overhead, name="overhead"),
    }
    return as_rational(instantiate(ratio_of_bits_expr(), subs))


def sequential_bits_per_component(
    geometry: KVGeometry, sequential_bits: ExactLike
) -> sympy.Rational:
    """The sequential rate spread over every KV component of a token position.

    This is the unit the per-vector "Shannon limit" is stated in; for the paper's geometry it is
    about 3.3e-6 bits per component against TurboQuant's 3.

    >>> sequential_bits_per_component(PAPER_70B, 4.3)
    43/13107200
    """
    bits = exact_positive(sequential_bits, name="sequential_bits")
    return as_rational(bits / components_per_token(geometry))


def per_vector_over_sequential(
    geometry: KVGeometry,
    bits_per_component: ExactLike,
    sequential_bits: ExactLike,
    overhead: ExactLike = 1,
) -> RatioResult:
    """The ratio for any model geometry, with its inputs.

    >>> round(per_vector_over_sequential(SMOLLM2_135M, 3, 4.3).ratio_float, 1)
    8037.2
    """
    per_vector = per_vector_bits_per_token(geometry, bits_per_component)
    return RatioResult(
        geometry=geometry,
        bits_per_component=exact_positive(bits_per_component, name="bits_per_component"),
        sequential_bits=exact_positive(sequential_bits, name="sequential_bits"),
        overhead=exact_positive(overhead, name="overhead"),
        per_vector_bits=per_vector,
        ratio=ratio(per_vector, sequential_bits, overhead),
    )


def paper_ratio(overhead: ExactLike = 1) -> RatioResult:
    """The paper's ratio: 3 bits, 80 layers, 64 heads, head dim 128, over 4.3 bits.

    >>> round(paper_ratio().ratio_float, 1)
    914455.8
    >>> round(paper_ratio(PAPER_OVERHEAD).ratio_float, 1)
    914.5
    """
    return per_vector_over_sequential(
        PAPER_70B, PAPER_BITS_PER_COMPONENT, PAPER_SEQUENTIAL_BITS, overhead
    )


def gqa_70b_ratio(overhead: ExactLike = 1) -> RatioResult:
    """The paper's ratio with the 8 KV heads a Llama-style 70B model really stores.

    >>> round(gqa_70b_ratio().ratio_float, 1)
    114307.0
    """
    return per_vector_over_sequential(
        LLAMA_70B_GQA, PAPER_BITS_PER_COMPONENT, PAPER_SEQUENTIAL_BITS, overhead
    )

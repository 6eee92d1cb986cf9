"""Bits per token from perplexity: the paper's corollary that the sequential bound is log2(PPL).

Paper: arXiv 2604.15356, corollary of Theorem 1: the average sequential bound is log2(perplexity)
bits per token *position* (all layers and heads together): 3.32 bits at perplexity 10 and 4.32
at perplexity 20. Derivation: perplexity is 2 to the mean per-token cross-entropy in bits,

    PPL = 2 ** (-(1/N) sum_i log2 q(t_i | t_<i))   =>   bits per token = log2(PPL).

Invariants:

1. (enforced) Perplexity is a finite number >= 1 (a mean cross-entropy is >= 0 bits); it is kept
   exact, so ``bits_per_token(10)`` is the symbol-free sympy number log(10)/log(2).
2. (checked) ``perplexity_for_bits`` inverts ``bits_per_token`` exactly (2 ** log2 x = x).
3. (assumed) The perplexity is measured with base-2 logs over the same tokenisation the coder
   uses; a per-word or per-character perplexity would need converting first.

What the paper gets wrong: log2 perplexity on a data set is a *cross-entropy* H(p_data, q_model),
not the entropy H in Theorem 1. By Gibbs' inequality it is an upper bound on the data source's
entropy rate (H(p) <= H(p, q)), and it is the mean code length an arithmetic coder driven by the
model achieves on that data; so as an achievable rate, and as an upper bound on the source's H,
the corollary stands. It is not the entropy under the model's own distribution, H(q), and it
bounds H(q) in neither direction (``cross_entropy_bits`` and ``entropy_bits`` in
``seqkv.proofs.information`` show both orders on two-symbol examples). ``PerplexityBound`` carries
this in its boolean fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy

from seqkv.errors import ProofInputError

from ._exact import ExactLike, as_float, exact, instantiate

PERPLEXITY = sympy.Symbol("PPL", positive=True)
BITS = sympy.Symbol("bits", nonnegative=True)

PAPER_BITS_AT_PERPLEXITY = ((10, 3.32), (20, 4.32))
"""The paper's (perplexity, bits per token) pairs."""


def bits_per_token_expr() -> sympy.Expr:
    """log2 of the perplexity, symbolic.

    >>> bits_per_token_expr()
    log(PPL)/log(2)
    """
    return sympy.log(PERPLEXITY, 2)


def perplexity_expr() -> sympy.Expr:
    """2 to the bits per token, symbolic: the inverse of ``bits_per_token_expr``.

    >>> perplexity_expr()
    2**bits
    """
    return 2**BITS


def _perplexity(perplexity: ExactLike) -> sympy.Rational:
    value = exact(perplexity, name="perplexity")
    if not value >= 1:
        raise ProofInputError(
            f"perplexity must be >= 1 (a cross-entropy is >= 0 bits), got {perplexity!r}"
        )
    return value


def bits_per_token(perplexity: ExactLike) -> sympy.Expr:
    """Exact bits per token at ``perplexity``, a symbol-free sympy number.

    >>> bits_per_token(16)
    4
    >>> bits_per_token(10)
    1 + log(5)/log(2)
    """
    # NOTE: sympy.log(x, 2) rather than instantiating bits_per_token_expr(): the base-2 form
    # evaluates exact powers of two (log(16, 2) = 4) without a costly simplify; the tests check
    # that the two agree.
    return sympy.log(_perplexity(perplexity), 2)


def bits_per_token_float(perplexity: ExactLike) -> float:
    """``bits_per_token`` as a float.

    >>> round(bits_per_token_float(10), 4), round(bits_per_token_float(20), 4)
    (3.3219, 4.3219)
    """
    return as_float(bits_per_token(perplexity))


def perplexity_for_bits(bits: ExactLike) -> sympy.Expr:
    """The perplexity whose log2 is ``bits``, exact.

    >>> perplexity_for_bits(4.3)
    16*2**(3/10)
    >>> round(float(perplexity_for_bits(4.3)), 2)
    19.7
    """
    value = exact(bits, name="bits")
    if not value >= 0:
        raise ProofInputError(f"bits must be >= 0, got {bits!r}")
    return instantiate(perplexity_expr(), {BITS: value})


@dataclass(frozen=True, slots=True)
class PerplexityBound:
    """log2(perplexity) as the paper uses it, with what kind of quantity it is."""

    perplexity: sympy.Rational
    bits_per_token_exact: sympy.Expr
    # NOTE: the three flags are constant on purpose: they are facts about any perplexity measured
    # on data, kept in the result so a report cannot print the number without its meaning.
    is_cross_entropy: bool = True
    upper_bounds_source_entropy_rate: bool = True  # Gibbs: H(p) <= H(p, q)
    bounds_model_entropy: bool = False  # H(q) may lie above or below H(p, q)

    @property
    def bits_per_token(self) -> float:
        """The bound as a float."""
        return as_float(self.bits_per_token_exact)

    def rounds_to(self, paper_bits: float, places: int = 2) -> bool:
        """Whether the bound rounds to ``paper_bits`` at ``places`` decimals."""
        return math.isclose(round(self.bits_per_token, places), paper_bits, abs_tol=1e-12)


def perplexity_bound(perplexity: ExactLike) -> PerplexityBound:
    """The corollary's bound at ``perplexity``.

    >>> bound = perplexity_bound(20)
    >>> round(bound.bits_per_token, 2), bound.is_cross_entropy, bound.bounds_model_entropy
    (4.32, True, False)
    """
    value = _perplexity(perplexity)
    return PerplexityBound(perplexity=value, bits_per_token_exact=bits_per_token(value))

"""Typed wrappers around sympy's exact numbers, shared by the proof modules.

sympy ships no type information, so the proof modules turn user input into sympy numbers, and
sympy results back into Python numbers, only through these helpers. They validate the input and
pin the Python type of the output, so ``mypy --strict`` sees ``int`` and ``float`` where it
matters and no ``type: ignore`` is needed anywhere in ``seqkv.proofs``.

Invariants:

1. (enforced) ``exact`` never rounds. An ``int`` or ``Fraction`` converts exactly; a ``float``
   converts through its shortest decimal ``repr`` (``4.3`` becomes ``43/10``, not the binary
   double nearest to 4.3), because the paper's figures are decimal literals.
2. (enforced) ``bool``, NaN and infinities are rejected: a bool is a ``ProofInputTypeError`` (a
   ``TypeError``), a non-finite float a ``ProofInputError`` (a ``ValueError``).
3. (enforced) ``instantiate`` replaces symbols structurally (``xreplace``, not ``subs``): the
   values are exact numbers, so no pattern matching is needed, and it is ~40x faster.
4. (checked) ``as_rational`` and ``as_int`` assert that a substituted expression has become a
   rational (an integer) number; a leftover free symbol is a bug in the caller, not user error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

import sympy

from seqkv.errors import ProofInputError, ProofInputTypeError

ExactLike = int | float | Fraction
"""What the public functions accept as a number; sympy ``Rational`` values are accepted too."""


def exact(value: ExactLike, *, name: str) -> sympy.Rational:
    """Convert ``value`` to an exact ``sympy.Rational`` without rounding.

    >>> exact(4.3, name="bits")
    43/10
    >>> exact(Fraction(1, 3), name="f")
    1/3
    """
    if isinstance(value, bool):
        raise ProofInputTypeError(f"{name} must be a number, not bool ({value!r})")
    if isinstance(value, sympy.Rational):
        return value
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, Fraction):
        return sympy.Rational(value.numerator, value.denominator)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProofInputError(f"{name} must be finite, got {value!r}")
        # NOTE: through repr, not sympy.Rational(value): the latter gives the exact binary double
        # (4.3 -> 4841369599423283/1125899906842624), which no paper figure means.
        return sympy.Rational(repr(value))
    raise ProofInputTypeError(
        f"{name} must be an int, float or Fraction, got {type(value).__name__}"
    )


def exact_positive(value: ExactLike, *, name: str) -> sympy.Rational:
    """``exact`` plus a check that the value is strictly positive."""
    result = exact(value, name=name)
    if not result > 0:
        raise ProofInputError(f"{name} must be > 0, got {value!r}")
    return result


def instantiate(expr: sympy.Expr, values: Mapping[sympy.Symbol, object]) -> sympy.Expr:
    """Replace each symbol in ``values`` by its value (a number or expression) in ``expr``.

    >>> x = sympy.Symbol("x")
    >>> instantiate(2 * x + 1, {x: sympy.Rational(1, 2)})
    2
    """
    return expr.xreplace(
        {symbol: sympy.sympify(value, strict=True) for symbol, value in values.items()}
    )


def as_rational(expr: sympy.Expr) -> sympy.Rational:
    """Return ``expr`` as a ``sympy.Rational``; it must have no free symbols left."""
    assert isinstance(expr, sympy.Rational), f"expected a rational number, got {expr!r}"
    return expr


def as_int(expr: sympy.Expr) -> int:
    """Return ``expr`` as a Python ``int``; it must be a sympy integer."""
    assert isinstance(expr, sympy.Integer), f"expected an integer, got {expr!r}"
    return int(expr)


def as_float(expr: sympy.Expr) -> float:
    """Return ``expr`` evaluated to a Python ``float``; it must have no free symbols left."""
    assert not getattr(expr, "free_symbols", set()), f"expected a number, got {expr!r}"
    return float(expr)


def positive_int(value: int, *, name: str) -> int:
    """Return ``value`` if it is a positive ``int`` (not a bool), else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProofInputTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ProofInputError(f"{name} must be > 0, got {value}")
    return value

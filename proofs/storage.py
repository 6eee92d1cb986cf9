"""The prefix layer's storage corollary: relative storage = 1 - f (1 - l / n).

Paper: arXiv 2604.15356, Layer 1 (probabilistic prefix deduplication). Sessions whose trie
distance is within a threshold form clusters that share the KV of their common prefix and store
only a tail. The corollary: relative storage = 1 - f (1 - l/n), f = fraction of sessions in
clusters, l = mean tail length, n = sequence length.

Derivation (``derive_relative_storage``). N sessions of n token positions each, every position
costing the same number of bytes. The f N clustered sessions store only their tails, l positions
each; the (1 - f) N others store all n. Total over the unshared N n:

    (f N l + (1 - f) N n) / (N n) = f l/n + 1 - f = 1 - f (1 - l/n).

Invariants:

1. (enforced) 0 <= f <= 1, 0 <= l <= n, n > 0, N > 0; clusters K satisfy 1 <= K <= f N when
   f > 0 (a cluster holds at least one session) and K = 0 when f = 0; 0 <= prefix length <= n.
2. (checked) ``derive_relative_storage`` rebuilds the paper's expression from the totals above
   and sympy confirms the two are identical.
3. (assumed) Every token position costs the same bytes, tails are stored as plainly as unshared
   sessions, and the per-session metadata (trie nodes, cluster ids) is free.

What the paper gets wrong: the shared prefix has to be stored too, once per cluster, and the
corollary neglects it. ``relative_storage_with_prefix`` counts it:

    1 - f (1 - l/n) + K p / (N n),   K = number of clusters, p = shared prefix length.

With p = n - l (prefix plus tail make a session), a cluster of m sessions saves (m - 1)(n - l)
positions, not m (n - l): singleton clusters (K = f N) save nothing and the expression is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from seqkv.errors import ProofInputError

from ._exact import ExactLike, as_float, as_rational, exact, instantiate

CLUSTERED_FRACTION = sympy.Symbol("f", nonnegative=True)
TAIL_LENGTH = sympy.Symbol("l", nonnegative=True)
SEQUENCE_LENGTH = sympy.Symbol("n", positive=True)
SESSIONS = sympy.Symbol("N", positive=True)
CLUSTERS = sympy.Symbol("K", nonnegative=True)
PREFIX_LENGTH = sympy.Symbol("p", nonnegative=True)


def relative_storage_expr() -> sympy.Expr:
    """The paper's corollary, symbolic.

    >>> relative_storage_expr()
    -f*(-l/n + 1) + 1
    """
    return 1 - CLUSTERED_FRACTION * (1 - TAIL_LENGTH / SEQUENCE_LENGTH)


def relative_storage_with_prefix_expr() -> sympy.Expr:
    """The corollary plus the shared prefixes, stored once per cluster.

    >>> relative_storage_with_prefix_expr()
    K*p/(N*n) - f*(-l/n + 1) + 1
    """
    return relative_storage_expr() + CLUSTERS * PREFIX_LENGTH / (SESSIONS * SEQUENCE_LENGTH)


@dataclass(frozen=True, slots=True)
class StorageDerivation:
    """The corollary rebuilt from storage totals."""

    total_positions: sympy.Expr  # positions stored over all N sessions
    unshared_positions: sympy.Expr  # N n: every session stored in full
    relative: sympy.Expr  # total / unshared, simplified
    matches_paper: bool  # relative - relative_storage_expr() simplifies to 0


def derive_relative_storage() -> StorageDerivation:
    """Derive the corollary from the totals and compare it with the paper's expression.

    >>> derive_relative_storage().matches_paper
    True
    """
    f, tail, n, sessions = CLUSTERED_FRACTION, TAIL_LENGTH, SEQUENCE_LENGTH, SESSIONS
    total = f * sessions * tail + (1 - f) * sessions * n
    unshared = sessions * n
    relative = sympy.simplify(total / unshared)
    difference = sympy.simplify(relative - relative_storage_expr())
    return StorageDerivation(
        total_positions=total,
        unshared_positions=unshared,
        relative=relative,
        matches_paper=bool(difference == 0),
    )


@dataclass(frozen=True, slots=True)
class _StorageInputs:
    clustered_fraction: sympy.Rational
    tail_length: sympy.Rational
    sequence_length: sympy.Rational


def _inputs(
    clustered_fraction: ExactLike, tail_length: ExactLike, sequence_length: ExactLike
) -> _StorageInputs:
    f = exact(clustered_fraction, name="clustered_fraction")
    tail = exact(tail_length, name="tail_length")
    n = exact(sequence_length, name="sequence_length")
    if not 0 <= f <= 1:
        raise ProofInputError(
            f"clustered_fraction is a fraction in [0, 1], got {clustered_fraction!r}"
        )
    if not n > 0:
        raise ProofInputError(f"sequence_length must be > 0, got {sequence_length!r}")
    if not 0 <= tail <= n:
        raise ProofInputError(
            f"tail_length must lie in [0, sequence_length={sequence_length!r}], got {tail_length!r}"
        )
    return _StorageInputs(clustered_fraction=f, tail_length=tail, sequence_length=n)


def relative_storage(
    clustered_fraction: ExactLike, tail_length: ExactLike, sequence_length: ExactLike
) -> sympy.Rational:
    """The paper's relative storage, exact.

    >>> relative_storage(0.5, 100, 1000)
    11/20
    """
    inputs = _inputs(clustered_fraction, tail_length, sequence_length)
    subs = {
        CLUSTERED_FRACTION: inputs.clustered_fraction,
        TAIL_LENGTH: inputs.tail_length,
        SEQUENCE_LENGTH: inputs.sequence_length,
    }
    return as_rational(instantiate(relative_storage_expr(), subs))


def relative_storage_with_prefix(
    clustered_fraction: ExactLike,
    tail_length: ExactLike,
    sequence_length: ExactLike,
    *,
    clusters: int,
    prefix_length: ExactLike,
    sessions: int,
) -> sympy.Rational:
    """Relative storage with each cluster's shared prefix stored once.

    >>> relative_storage_with_prefix(0.5, 100, 1000, clusters=5, prefix_length=900, sessions=100)
    119/200
    """
    inputs = _inputs(clustered_fraction, tail_length, sequence_length)
    if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions <= 0:
        raise ProofInputError(f"sessions must be a positive int, got {sessions!r}")
    if isinstance(clusters, bool) or not isinstance(clusters, int) or clusters < 0:
        raise ProofInputError(f"clusters must be a non-negative int, got {clusters!r}")
    clustered_sessions = inputs.clustered_fraction * sessions
    if clusters > clustered_sessions:
        raise ProofInputError(
            f"clusters={clusters} exceeds the {clustered_sessions} clustered sessions "
            "(clustered_fraction x sessions); a cluster holds at least one session"
        )
    if clustered_sessions > 0 and clusters == 0:
        raise ProofInputError("clustered_fraction > 0 needs clusters >= 1 to hold those sessions")
    prefix = exact(prefix_length, name="prefix_length")
    if not 0 <= prefix <= inputs.sequence_length:
        raise ProofInputError(
            f"prefix_length must lie in [0, sequence_length={sequence_length!r}], "
            f"got {prefix_length!r}"
        )
    subs = {
        CLUSTERED_FRACTION: inputs.clustered_fraction,
        TAIL_LENGTH: inputs.tail_length,
        SEQUENCE_LENGTH: inputs.sequence_length,
        CLUSTERS: clusters,
        PREFIX_LENGTH: prefix,
        SESSIONS: sessions,
    }
    return as_rational(instantiate(relative_storage_with_prefix_expr(), subs))


def relative_storage_float(
    clustered_fraction: ExactLike, tail_length: ExactLike, sequence_length: ExactLike
) -> float:
    """``relative_storage`` as a float.

    >>> relative_storage_float(1, 50, 200)
    0.25
    """
    return as_float(relative_storage(clustered_fraction, tail_length, sequence_length))

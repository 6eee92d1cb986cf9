"""Entropies of finite distributions in bits: the numeric side of the symbolic proofs.

The proofs in this package are symbolic; these helpers let tests and the checker confirm them on
small synthetic sources (``seqkv.proofs.theorem1``) and show the gap between a cross-entropy and
an entropy (``seqkv.proofs.perplexity``). Joint distributions are 2-D arrays ``joint[x, y]`` =
P(X = x, Y = y); maps are integer arrays of output labels.

Invariants:

1. (enforced) A distribution is finite, non-negative and sums to 1 within ``atol``; otherwise
   ``ProofInputError`` (a ``ValueError``) says which.
2. (enforced) ``0 log 0 = 0``: zero-probability entries add nothing.
3. (checked) ``push_forward`` conserves probability mass (asserted).

Nothing here mutates its inputs; every function returns a new array or a float.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from seqkv.errors import ProofInputError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DISTRIBUTION_ATOL = 1e-9


def as_distribution(p: npt.ArrayLike, *, name: str, ndim: int) -> FloatArray:
    """Validate ``p`` as a probability distribution with ``ndim`` axes and return it as float64."""
    array = np.asarray(p, dtype=np.float64)
    if array.ndim != ndim:
        raise ProofInputError(f"{name} must have {ndim} axes, got shape {array.shape}")
    if array.size == 0:
        raise ProofInputError(f"{name} is empty")
    if not np.all(np.isfinite(array)):
        raise ProofInputError(f"{name} has NaN or infinite entries")
    if np.any(array < 0):
        raise ProofInputError(f"{name} has negative entries")
    total = float(array.sum())
    if not math.isclose(total, 1.0, rel_tol=0.0, abs_tol=DISTRIBUTION_ATOL):
        raise ProofInputError(f"{name} must sum to 1, sums to {total!r}; normalise it first")
    return array


def entropy_bits(p: npt.ArrayLike) -> float:
    """Shannon entropy H(p) in bits of a 1-D distribution.

    >>> entropy_bits([0.5, 0.25, 0.25])
    1.5
    """
    array = as_distribution(p, name="p", ndim=1)
    return _entropy(array)


def _entropy(array: FloatArray) -> float:
    positive = array[array > 0]
    return float(-(positive * np.log2(positive)).sum())


def conditional_entropy_bits(joint: npt.ArrayLike) -> float:
    """H(Y | X) in bits for ``joint[x, y]`` = P(X = x, Y = y), as H(X, Y) - H(X).

    >>> conditional_entropy_bits([[0.25, 0.25], [0.5, 0.0]])
    0.5
    """
    array = as_distribution(joint, name="joint", ndim=2)
    return max(0.0, _entropy(array.ravel()) - _entropy(array.sum(axis=1)))


def cross_entropy_bits(p: npt.ArrayLike, q: npt.ArrayLike) -> float:
    """Cross-entropy H(p, q) = -sum p log2 q in bits: the mean code length of p-data coded with q.

    Infinite when q gives zero probability to an outcome p can produce.

    >>> cross_entropy_bits([1.0, 0.0], [0.5, 0.5])
    1.0
    """
    p_array = as_distribution(p, name="p", ndim=1)
    q_array = as_distribution(q, name="q", ndim=1)
    if p_array.shape != q_array.shape:
        raise ProofInputError(f"p and q differ in shape: {p_array.shape} vs {q_array.shape}")
    support = p_array > 0
    if np.any(q_array[support] == 0):
        return math.inf
    return float(-(p_array[support] * np.log2(q_array[support])).sum())


def push_forward(
    joint: npt.ArrayLike, row_map: npt.ArrayLike, cell_map: npt.ArrayLike
) -> FloatArray:
    """The joint law of (g(X), F(X, Y)) for ``joint[x, y]``, g = ``row_map``, F = ``cell_map``.

    ``row_map[x]`` labels row x; ``cell_map[x, y]`` labels cell (x, y) (a 1-D ``cell_map`` is
    broadcast over rows, F(x, y) = f(y)). Labels are any integers; the result's axes are the
    distinct labels in increasing order.

    >>> push_forward([[0.25, 0.25], [0.25, 0.25]], [0, 0], [7, 7]).tolist()
    [[1.0]]
    """
    array = as_distribution(joint, name="joint", ndim=2)
    rows, cols = array.shape
    row_labels = _labels(row_map, name="row_map")
    cell_labels = _cell_labels(cell_map, rows=rows, cols=cols)
    if row_labels.shape != (rows,):
        raise ProofInputError(f"row_map must have shape ({rows},), got {row_labels.shape}")
    _, row_index = np.unique(row_labels, return_inverse=True)  # [rows]
    _, cell_index = np.unique(cell_labels.ravel(), return_inverse=True)  # [rows * cols]
    out = np.zeros((int(row_index.max()) + 1, int(cell_index.max()) + 1), dtype=np.float64)
    row_of_cell = np.repeat(row_index, cols)  # [rows * cols]
    np.add.at(out, (row_of_cell, cell_index), array.ravel())
    assert math.isclose(float(out.sum()), float(array.sum()), abs_tol=1e-12), "mass not conserved"
    return out


def _labels(labels: npt.ArrayLike, *, name: str) -> IntArray:
    array = np.asarray(labels)
    if not np.issubdtype(array.dtype, np.integer):
        raise ProofInputError(f"{name} must hold integer labels, got dtype {array.dtype}")
    return array.astype(np.int64)


def _cell_labels(cell_map: npt.ArrayLike, *, rows: int, cols: int) -> IntArray:
    labels = _labels(cell_map, name="cell_map")
    if labels.shape == (cols,):
        return np.broadcast_to(labels, (rows, cols))  # [rows, cols]: F(x, y) = f(y)
    if labels.shape != (rows, cols):
        raise ProofInputError(
            f"cell_map must have shape ({cols},) or ({rows}, {cols}), got {labels.shape}"
        )
    return labels


def injective_on_support(joint: npt.ArrayLike, cell_map: npt.ArrayLike) -> bool:
    """Whether y -> F(x, y) is one-to-one on {y : P(x, y) > 0} for every row x.

    >>> injective_on_support([[0.5, 0.5, 0.0]], [1, 2, 2])
    True
    """
    array = as_distribution(joint, name="joint", ndim=2)
    rows, cols = array.shape
    labels = _cell_labels(cell_map, rows=rows, cols=cols)  # [rows, cols]
    for x in range(rows):
        used = labels[x][array[x] > 0]
        if np.unique(used).size != used.size:
            return False
    return True


def is_injective(labels: npt.ArrayLike) -> bool:
    """Whether a 1-D array of labels has no repeats (the map index -> label is one-to-one).

    >>> is_injective([3, 1, 2]), is_injective([3, 1, 3])
    (True, False)
    """
    array = np.asarray(labels).ravel()
    return bool(np.unique(array).size == array.size)

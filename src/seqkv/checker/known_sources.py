"""Synthetic sources whose entropies are known exactly: what the estimators are tested against.

The tests (``tests/test_checker_estimators.py``) and the coverage study
(``benchmarks/estimator_coverage.py``) measure how often each interval covers the truth; both need
the same sources with closed-form answers.

Invariants:
1. Every source is a pure function of its seed (enforced: a local ``numpy`` generator).
2. ``MarkovSource`` follows ``seqkv.checker.sampling.SequenceSource``: natural-log probabilities
   as ``[batch, vocab]`` float64 tensors (enforced by the types).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
from scipy import signal


def entropy_bits(p: npt.NDArray[np.floating]) -> float:
    """Shannon entropy in bits of a probability vector (zero entries contribute nothing)."""
    q = np.asarray(p, dtype=np.float64)
    q = q[q > 0]
    return float(-(q * np.log2(q)).sum())


class MarkovSource:
    """A first-order Markov chain over 8 symbols, started from its stationary distribution."""

    vocab_size = 8

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.transition = rng.dirichlet(np.ones(8) * 0.5, size=8)  # [from, to]
        eigenvalues, eigenvectors = np.linalg.eig(self.transition.T)
        stationary = np.real(eigenvectors[:, np.argmin(np.abs(eigenvalues - 1))])
        self.stationary = stationary / stationary.sum()
        self.rate = float(sum(self.stationary[i] * entropy_bits(self.transition[i])
                              for i in range(8)))

    def block_entropy_per_token(self, length: int) -> float:
        """H(t_1..t_L) / L from the stationary start: what the entropy-rate estimator targets."""
        return (entropy_bits(self.stationary) + (length - 1) * self.rate) / length

    def start(self, batch: int) -> torch.Tensor:
        return torch.log(torch.tensor(self.stationary)).expand(batch, -1).clone()

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.tensor(self.transition))[tokens]


def ar1_series(rng: np.random.Generator, size: int, phi: float) -> npt.NDArray[np.float64]:
    """A stationary AR(1) series ``x_i = phi x_(i-1) + e_i`` with mean 0 and unit innovations:
    its mean's standard error is about ``1 / ((1 - phi) sqrt(size))``, far above the i.i.d.
    ``std(x) / sqrt(size)`` when ``phi`` is near 1."""
    noise = rng.normal(0.0, 1.0, size)
    noise[0] /= np.sqrt(1.0 - phi * phi)  # the first value from the stationary law
    return np.asarray(signal.lfilter([1.0], [1.0, -phi], noise), dtype=np.float64)

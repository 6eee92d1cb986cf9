"""``python -m research.bench quant``: measured quantizer distortion and the rate-distortion
sweep, as JSON.

Motivation: the quantizers' distortion figures in the TurboQuant paper are derivations; the
bench prints what this implementation measures on random unit vectors next to the paper's
figures, and, when given, the rows of the rate-distortion sweep (``research.bench.sweep``), so one
command reports both.

JSON shape (``QuantBenchResult.to_json_dict``):
``turboquant_mse``: ``{head_dim: {bits: E||x - xhat||^2}}`` (both keys decimal strings, head dims
"64" and "128", bits "1".."4" by default); ``turboquant_mse_paper``: the paper's
``{bits: value}``; ``turboquant_prod_ip``: ``{head_dim: {bits: d * E[(<y,x> - <y,xhat>)^2]}}``;
``n_vectors``, ``seed``; ``rate_distortion``: a list of sweep rows (empty when not run).

Invariants:
1. Deterministic for a given seed (enforced by ``research.bench.distortion``).
2. Every value is a JSON number, string, list or object (enforced by the TypedDicts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from research.bench.distortion import (
    DistortionTable,
    turboquant_mse_table,
    turboquant_prod_ip_table,
)
from research.bench.sweep import RatePoint, RatePointJSON

PAPER_TURBOQUANT_MSE: dict[str, float] = {"1": 0.36, "2": 0.117, "3": 0.03, "4": 0.009}
"""TurboQuant_mse distortion for unit vectors as the paper states it (arXiv 2504.19874)."""


class QuantBenchJSON(TypedDict):
    turboquant_mse: DistortionTable
    turboquant_mse_paper: dict[str, float]
    turboquant_prod_ip: DistortionTable
    n_vectors: int
    seed: int
    rate_distortion: list[RatePointJSON]


@dataclass(frozen=True)
class QuantBenchResult:
    turboquant_mse: DistortionTable
    turboquant_prod_ip: DistortionTable
    n_vectors: int
    seed: int
    rate_distortion: tuple[RatePoint, ...] = ()

    def to_json_dict(self) -> QuantBenchJSON:
        return QuantBenchJSON(
            turboquant_mse=self.turboquant_mse,
            turboquant_mse_paper=dict(PAPER_TURBOQUANT_MSE),
            turboquant_prod_ip=self.turboquant_prod_ip,
            n_vectors=self.n_vectors,
            seed=self.seed,
            rate_distortion=[p.to_json_dict() for p in self.rate_distortion],
        )


def run_quant_bench(
    dims: Sequence[int] = (64, 128),
    bits: Sequence[int] = (1, 2, 3, 4),
    n_vectors: int = 4000,
    seed: int = 0,
    rate_distortion: Sequence[RatePoint] = (),
    prod_seeds: int = 8,
) -> QuantBenchResult:
    """Measure TurboQuant on random unit vectors; attach sweep rows if given.

    ``prod_seeds`` quantizers share the inner-product measurement (its expectation is over the
    QJL matrix; see ``turboquant_prod_ip_table``).

    >>> result = run_quant_bench(dims=(64,), bits=(2,), n_vectors=300, prod_seeds=1)
    >>> sorted(result.to_json_dict()["turboquant_mse"]["64"])
    ['2']
    """
    return QuantBenchResult(
        turboquant_mse=turboquant_mse_table(dims, bits, n_vectors, seed),
        turboquant_prod_ip=turboquant_prod_ip_table(dims, bits, n_vectors, seed,
                                                    n_seeds=prod_seeds),
        n_vectors=n_vectors,
        seed=seed,
        rate_distortion=tuple(rate_distortion),
    )

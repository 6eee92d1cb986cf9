"""The paper's fp16 KV-cache memory figure for a 70B model at 128K context, against arithmetic.

Paper: arXiv 2604.15356 states that a 70B model at 128K context needs "about 80 GB" of fp16 KV
cache. The cache holds every KV component of every token position:

    bytes = 2 (K, V) x layers x kv_heads x head_dim x bytes_per_component x context_tokens

With the paper's own geometry (80 layers, 64 heads, head dim 128, fp16 = 2 bytes) that is
2,621,440 bytes per token: 335.5 GB at 128,000 tokens and 343.6 GB (320 GiB) at 131,072. With the
8 KV heads of a grouped-query 70B model it is 41.9 GB (128,000) or 42.9 GB = 40 GiB (131,072).

Invariants:

1. (enforced) Context length and bytes per component are positive ints; the geometry is a
   validated ``KVGeometry``.
2. (checked) Byte counts come from ``kv_cache_bytes_expr`` by substitution, and are exact ints.
3. (checked) "About 80 GB" is compared in both decimal GB (1e9 bytes) and GiB (2**30 bytes), for
   both readings of "128K" (128,000 and 131,072 tokens); the figure counts as consistent if any
   reading is within ``tolerance`` (relative, default 25%, a generous reading of "about").
4. (assumed) No quantization, paging slack, or framework overhead: the figure is the payload.

What the paper gets wrong: "about 80 GB" matches neither head count, under any reading (it is
4.2x too small for 64 KV heads and 1.9x too large for 8). Solving the formula for the head count,
80 GB implies 15.3 KV heads (decimal) or exactly 16 (80 GiB at 131,072 tokens), a geometry the
paper never states.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from seqkv.errors import ProofInputError
from seqkv.types import KVGeometry

from ._exact import as_int, as_rational, instantiate, positive_int
from .ratios import (
    HEAD_DIM,
    KV_HEADS,
    LAYERS,
    LLAMA_70B_GQA,
    PAPER_70B,
    components_per_token_expr,
)

BYTES_PER_COMPONENT = sympy.Symbol("B", integer=True, positive=True)
CONTEXT_TOKENS = sympy.Symbol("T", integer=True, positive=True)

FP16_BYTES = 2
GB = 10**9
GIB = 2**30
PAPER_MEMORY_GB = 80
CONTEXT_128K_DECIMAL = 128_000
CONTEXT_128K_BINARY = 131_072
DEFAULT_TOLERANCE = 0.25
"""Relative error allowed for "about": generous on purpose, so a failure is not a rounding."""


def kv_cache_bytes_expr() -> sympy.Expr:
    """Bytes of a KV cache over a context.

    >>> kv_cache_bytes_expr()
    2*B*H_kv*L*T*d_head
    """
    return components_per_token_expr() * BYTES_PER_COMPONENT * CONTEXT_TOKENS


def kv_cache_bytes(
    geometry: KVGeometry, context_tokens: int, bytes_per_component: int = FP16_BYTES
) -> int:
    """Exact bytes of the KV cache of ``geometry`` over ``context_tokens`` positions.

    >>> kv_cache_bytes(PAPER_70B, 128_000)
    335544320000
    """
    subs = {
        LAYERS: geometry.layers,
        KV_HEADS: geometry.kv_heads,
        HEAD_DIM: geometry.head_dim,
        BYTES_PER_COMPONENT: positive_int(bytes_per_component, name="bytes_per_component"),
        CONTEXT_TOKENS: positive_int(context_tokens, name="context_tokens"),
    }
    return as_int(instantiate(kv_cache_bytes_expr(), subs))


def implied_kv_heads(
    target_bytes: int,
    *,
    layers: int,
    head_dim: int,
    context_tokens: int,
    bytes_per_component: int = FP16_BYTES,
) -> sympy.Rational:
    """Solve the byte formula for the KV head count that gives ``target_bytes``.

    >>> implied_kv_heads(80 * GIB, layers=80, head_dim=128, context_tokens=131_072)
    16
    """
    heads = sympy.Symbol("heads", positive=True)
    equation = sympy.Eq(
        instantiate(
            kv_cache_bytes_expr(),
            {
                LAYERS: positive_int(layers, name="layers"),
                KV_HEADS: heads,
                HEAD_DIM: positive_int(head_dim, name="head_dim"),
                BYTES_PER_COMPONENT: positive_int(bytes_per_component, name="bytes_per_component"),
                CONTEXT_TOKENS: positive_int(context_tokens, name="context_tokens"),
            },
        ),
        positive_int(target_bytes, name="target_bytes"),
    )
    solutions = sympy.solve(equation, heads)
    assert len(solutions) == 1, f"the byte formula is linear in the head count: {solutions!r}"
    return as_rational(solutions[0])


@dataclass(frozen=True, slots=True)
class KVMemoryFigure:
    """The payload size of one KV cache, in bytes, GB and GiB."""

    geometry: KVGeometry
    context_tokens: int
    bytes_per_component: int
    total_bytes: int

    @property
    def gigabytes(self) -> float:
        """Decimal gigabytes (1e9 bytes)."""
        return self.total_bytes / GB

    @property
    def gibibytes(self) -> float:
        """Binary gibibytes (2**30 bytes)."""
        return self.total_bytes / GIB

    def relative_error(self, paper_gigabytes: float) -> float:
        """Smallest relative error of ``paper_gigabytes`` against this figure, in GB or GiB."""
        if not paper_gigabytes > 0:
            raise ProofInputError(f"paper_gigabytes must be > 0, got {paper_gigabytes!r}")
        return min(
            abs(self.gigabytes - paper_gigabytes) / paper_gigabytes,
            abs(self.gibibytes - paper_gigabytes) / paper_gigabytes,
        )


def kv_memory_figure(
    geometry: KVGeometry, context_tokens: int, bytes_per_component: int = FP16_BYTES
) -> KVMemoryFigure:
    """``kv_cache_bytes`` with its inputs, as a figure a report can show."""
    return KVMemoryFigure(
        geometry=geometry,
        context_tokens=context_tokens,
        bytes_per_component=bytes_per_component,
        total_bytes=kv_cache_bytes(geometry, context_tokens, bytes_per_component),
    )


@dataclass(frozen=True, slots=True)
class MemoryClaimCheck:
    """The paper's "about 80 GB" beside the computed figures, and the verdict."""

    paper_gigabytes: float
    tolerance: float
    paper_heads_decimal: KVMemoryFigure  # 64 KV heads, 128,000 tokens: 335.5 GB
    paper_heads_binary: KVMemoryFigure  # 64 KV heads, 131,072 tokens: 343.6 GB = 320 GiB
    gqa_decimal: KVMemoryFigure  # 8 KV heads, 128,000 tokens: 41.9 GB
    gqa_binary: KVMemoryFigure  # 8 KV heads, 131,072 tokens: 42.9 GB = 40 GiB
    implied_kv_heads_decimal: sympy.Rational  # heads giving paper_gigabytes GB at 128,000
    implied_kv_heads_binary: sympy.Rational  # heads giving paper_gigabytes GiB at 131,072

    @property
    def figures(self) -> tuple[KVMemoryFigure, ...]:
        """Every computed figure, paper geometry first."""
        return (
            self.paper_heads_decimal,
            self.paper_heads_binary,
            self.gqa_decimal,
            self.gqa_binary,
        )

    @property
    def consistent_with_paper_heads(self) -> bool:
        """Whether the paper's figure matches its own 64-head geometry, under any reading."""
        return any(
            figure.relative_error(self.paper_gigabytes) <= self.tolerance
            for figure in (self.paper_heads_decimal, self.paper_heads_binary)
        )

    @property
    def consistent_with_gqa(self) -> bool:
        """Whether the paper's figure matches the real 8-KV-head geometry, under any reading."""
        return any(
            figure.relative_error(self.paper_gigabytes) <= self.tolerance
            for figure in (self.gqa_decimal, self.gqa_binary)
        )

    @property
    def consistent(self) -> bool:
        """Whether the paper's figure is consistent with either head count."""
        return self.consistent_with_paper_heads or self.consistent_with_gqa


def check_paper_memory_claim(
    paper_gigabytes: float = PAPER_MEMORY_GB, tolerance: float = DEFAULT_TOLERANCE
) -> MemoryClaimCheck:
    """Check "about 80 GB of fp16 KV for a 70B model at 128K context".

    >>> check = check_paper_memory_claim()
    >>> round(check.paper_heads_decimal.gigabytes, 1), round(check.gqa_decimal.gigabytes, 1)
    (335.5, 41.9)
    >>> check.consistent
    False
    """
    if not paper_gigabytes > 0:
        raise ProofInputError(f"paper_gigabytes must be > 0, got {paper_gigabytes!r}")
    if not 0 <= tolerance < 1:
        raise ProofInputError(f"tolerance is a relative error in [0, 1), got {tolerance!r}")
    return MemoryClaimCheck(
        paper_gigabytes=paper_gigabytes,
        tolerance=tolerance,
        paper_heads_decimal=kv_memory_figure(PAPER_70B, CONTEXT_128K_DECIMAL),
        paper_heads_binary=kv_memory_figure(PAPER_70B, CONTEXT_128K_BINARY),
        gqa_decimal=kv_memory_figure(LLAMA_70B_GQA, CONTEXT_128K_DECIMAL),
        gqa_binary=kv_memory_figure(LLAMA_70B_GQA, CONTEXT_128K_BINARY),
        implied_kv_heads_decimal=_implied_heads(paper_gigabytes * GB, CONTEXT_128K_DECIMAL),
        implied_kv_heads_binary=_implied_heads(paper_gigabytes * GIB, CONTEXT_128K_BINARY),
    )


def _implied_heads(target_bytes: float, context_tokens: int) -> sympy.Rational:
    return implied_kv_heads(
        round(target_bytes),
        layers=PAPER_70B.layers,
        head_dim=PAPER_70B.head_dim,
        context_tokens=context_tokens,
    )

"""The typed seam between seqkv and Triton: the only module that imports ``triton`` directly.

Motivation: Triton ships no type information, and ``mypy --strict`` rejects untyped decorators.
Rather than silence each kernel, this module wraps ``triton.jit`` once in typed functions and
re-exports ``triton.language`` as ``tl``, so every ``triton.py`` module type-checks without
``type: ignore`` comments of its own.

Invariants:
1. Only the ``triton.py`` modules import this module, and only after
   :func:`seqkv.kernels.dispatch.resolve_backend` chose Triton (enforced by the op functions;
   checked: ``tests/test_kernels_dispatch.py``).
2. ``kernel`` and ``device`` return exactly what ``triton.jit`` returns; the casts only describe
   it to mypy (enforced by construction).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar, cast

# NOTE: triton has no py.typed marker (import-untyped). The other two codes keep this line clean
# where triton is absent (import-not-found) or where a pyproject override already ignores it.
import triton  # type: ignore[import-untyped, import-not-found, unused-ignore]
import triton.language as tl  # type: ignore[import-untyped, import-not-found, unused-ignore]

__all__ = [
    "ENABLE_FP_FUSION",
    "Kernel",
    "Launcher",
    "cdiv",
    "device",
    "kernel",
    "next_power_of_2",
    "tl",
]

F = TypeVar("F", bound=Callable[..., object])

ENABLE_FP_FUSION = False
"""Passed to every launch as ``enable_fp_fusion``.

NOTE: Triton contracts ``a * b + c`` into one fused multiply-add by default, which rounds once
instead of twice. The torch references round twice, so fusion is disabled: every kernel then
performs the same IEEE operations as its reference, which is what makes integer outputs (codes,
tables) equal exactly.
"""


class Launcher(Protocol):
    """A kernel bound to a launch grid: call it with the kernel's arguments."""

    def __call__(self, *args: object, **kwargs: object) -> object: ...


class Kernel(Protocol):
    """A ``@triton.jit`` kernel: index it with a grid to launch it."""

    def __getitem__(self, grid: tuple[int, ...]) -> Launcher: ...


def kernel(fn: Callable[..., None]) -> Kernel:
    """``triton.jit`` for a kernel launched from Python as ``fn[grid](...)``."""
    return cast(Kernel, triton.jit(fn))


def device(fn: F) -> F:
    """``triton.jit`` for a helper called from other kernels (keeps its signature for mypy)."""
    return cast(F, triton.jit(fn))


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ``a`` and positive ``b``."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``): Triton block sizes."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()

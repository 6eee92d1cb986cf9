"""Comparing a kernel's output with its reference, and catching elements a kernel never wrote.

Motivation: ``torch.testing.assert_close`` says *that* two tensors differ; a failing kernel test
needs to say *how*: how many elements, whether NaN or inf appear on one side only, the largest
error, and where. :func:`assert_matches` reports that (after Liger-Kernel's test helper). Fresh
outputs are filled with sentinels (NaN for floats, an impossible value for integers, after
flash-linear-attention's tests), so an element the kernel never wrote cannot pass by accident.

Invariants:
1. Integer and boolean tensors compare exactly; ``atol`` and ``rtol`` apply to floats only
   (enforced: a nonzero tolerance for an integer dtype raises ``ValueError``).
2. NaN matches NaN; ``+inf`` matches ``+inf``. A NaN or inf on one side only is always a
   mismatch, whatever the tolerance (enforced).
3. Every dtype has at least one sentinel; for ``uint8`` and ``bool``, where every value is
   valid, two (``0`` and ``255``, ``False`` and ``True``): a test runs once per sentinel, and an
   unwritten element keeps the sentinel in at least one run (enforced by :func:`sentinels`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from .dispatch import interpreter_enabled

_MAX_LISTED = 5
"""Mismatching positions quoted in a failure message."""


@dataclass(frozen=True)
class Comparison:
    """How ``actual`` differs from ``expected``."""

    name: str
    numel: int
    mismatches: int
    nan_disagreements: int
    """Positions where exactly one side is NaN."""
    inf_disagreements: int
    """Positions where one side is +-inf and the other is not the same infinity."""
    max_abs_diff: float
    """Over positions where both sides are finite (0 if there are none)."""
    first: tuple[tuple[tuple[int, ...], float, float], ...]
    """Up to five ``(index, actual, expected)`` of mismatching positions."""
    atol: float
    rtol: float

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def message(self) -> str:
        where = "; ".join(f"at {i}: got {a!r}, want {e!r}" for i, a, e in self.first)
        return (
            f"{self.name}: {self.mismatches} of {self.numel} elements differ "
            f"(atol={self.atol:g}, rtol={self.rtol:g}); NaN on one side only: "
            f"{self.nan_disagreements}; inf disagreements: {self.inf_disagreements}; max |diff| "
            f"over finite pairs: {self.max_abs_diff:.3g}; {where}"
        )


def compare(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    name: str = "output",
) -> Comparison:
    """Elementwise comparison of two tensors of one shape and dtype (moved to the CPU)."""
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
        )
    if actual.dtype != expected.dtype:
        raise AssertionError(f"{name}: dtype {actual.dtype} != expected {expected.dtype}")
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if a.dtype.is_floating_point:
        a64, e64 = a.to(torch.float64), e.to(torch.float64)
        nan_a, nan_e = torch.isnan(a64), torch.isnan(e64)
        inf_a, inf_e = torch.isinf(a64), torch.isinf(e64)
        nan_bad = nan_a ^ nan_e
        inf_bad = (inf_a | inf_e) & ~(nan_a | nan_e) & (a64 != e64)
        finite = torch.isfinite(a64) & torch.isfinite(e64)
        diff = torch.where(finite, (a64 - e64).abs(), torch.zeros_like(a64))
        bad = nan_bad | inf_bad | (finite & (diff > atol + rtol * e64.abs()))
        max_abs = float(diff.max()) if diff.numel() else 0.0
        n_nan, n_inf = int(nan_bad.sum()), int(inf_bad.sum())
    else:
        if atol or rtol:
            raise ValueError(f"{name}: {a.dtype} outputs compare exactly; drop atol and rtol")
        bad = a != e
        diff_int = (a.to(torch.float64) - e.to(torch.float64)).abs()
        max_abs = float(diff_int.max()) if diff_int.numel() else 0.0
        n_nan = n_inf = 0
    positions = bad.nonzero()[:_MAX_LISTED].tolist()
    first = tuple(
        (tuple(p), float(a[tuple(p)].item()), float(e[tuple(p)].item())) for p in positions
    )
    return Comparison(
        name=name,
        numel=a.numel(),
        mismatches=int(bad.sum()),
        nan_disagreements=n_nan,
        inf_disagreements=n_inf,
        max_abs_diff=max_abs,
        first=first,
        atol=atol,
        rtol=rtol,
    )


def assert_matches(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    name: str = "output",
) -> None:
    """Raise ``AssertionError`` with :meth:`Comparison.message` unless the tensors match.

    >>> assert_matches(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    >>> assert_matches(torch.tensor([1, 2]), torch.tensor([1, 3]), name="codes")
    Traceback (most recent call last):
    ...
    AssertionError: codes: 1 of 2 elements differ (atol=0, rtol=0); NaN on one side only: 0; \
inf disagreements: 0; max |diff| over finite pairs: 1; at (1,): got 2.0, want 3.0
    """
    result = compare(actual, expected, atol=atol, rtol=rtol, name=name)
    if not result.ok:
        raise AssertionError(result.message())


def sentinels(dtype: torch.dtype) -> tuple[float | int | bool, ...]:
    """Fill values for fresh outputs of ``dtype``: one that no kernel writes, or two that
    together catch every unwritten element (``uint8``, ``bool``).

    >>> sentinels(torch.int32)
    (-2147483648,)
    """
    if dtype.is_floating_point:
        return (float("nan"),)
    if dtype == torch.bool:
        return (False, True)
    if dtype == torch.uint8:
        return (0, 255)
    return (int(torch.iinfo(dtype).min),)


def filled(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, value: float | int
) -> torch.Tensor:
    """A fresh tensor of ``shape`` filled with ``value`` (a sentinel)."""
    return torch.full(shape, value, dtype=dtype, device=device)


def use_interpreter_without_gpu() -> None:
    """Set ``TRITON_INTERPRET=1`` unless a CUDA device is present (an existing value is kept).

    Triton reads the variable when *it* is imported, and importing torch's or transformers'
    integrations may import it early (seqkv's test ``conftest.py`` does, through
    ``seqkv.models``). If ``triton`` is already loaded in compiled mode on a machine without a
    GPU, this raises ``RuntimeError`` saying to export the variable before Python starts
    (``scripts/test.sh`` does).
    """
    if torch.cuda.is_available():
        return
    os.environ.setdefault("TRITON_INTERPRET", "1")
    language = sys.modules.get("triton.language")
    # NOTE: in interpreter mode triton.jit returns InterpretedFunction objects, also for
    # triton.language's own jitted helpers such as tl.sum; a JITFunction here means triton was
    # imported before the variable was set, and its helpers cannot run on the interpreter.
    if language is not None and type(language.sum).__name__ != "InterpretedFunction":
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot run "
            "on the CPU interpreter; export TRITON_INTERPRET=1 before starting Python "
            "(scripts/test.sh does)"
        )


def kernel_device() -> torch.device:
    """Where kernel tests put their tensors: CUDA when a GPU is present and the interpreter is
    off (``scripts/gpu_check.sh``), else the CPU (Triton's interpreter)."""
    if torch.cuda.is_available() and not interpreter_enabled():
        return torch.device("cuda")
    return torch.device("cpu")

"""Batched frequency tables for the token coder: logits ``[N, V]`` -> int64 cumulative tables
``[N, V + 1]`` of total ``2**32``, every count at least 1.

Motivation: on a GPU the logits of many positions arrive together; building their tables there
avoids copying ``N x V`` float logits to the host. The algorithm is
:mod:`seqkv.coding.frequencies`'s (``floor(p * (2**32 - V)) + 1``, remainder on the first
argmax), with ``exp`` and the softmax sum pinned to fixed IEEE operation sequences so that the
kernel and its torch reference agree exactly (see :mod:`seqkv.kernels.frequencies.naive`).

Invariants:
1. Every table is non-decreasing from 0 to exactly ``2**32`` with every step at least 1
   (enforced by construction; checked: ``tests/test_kernels_frequencies.py``).
2. Kernel and reference tables are equal under Triton's interpreter (checked: same tests).
3. Exact equality with numpy's float64 softmax (``seqkv.coding.frequencies``), and between a
   GPU-built and a CPU-built table, is not promised. What keeps a GPU-built table from ever
   being decoded against a CPU-built one is the device class recorded in the ``.skv`` header,
   which a decoder checks before it decodes (assumed: ``seqkv.schedule`` / ``seqkv.container``).
4. Logits must not be NaN or ``+inf`` and each row needs a finite maximum; ``-inf`` entries are
   allowed and get a count of 1 (enforced: ``ValueError``, one device synchronisation per call).
"""

from __future__ import annotations

import torch

from seqkv.coding.frequencies import MAX_VOCAB, TOTAL_FREQUENCY

from ..dispatch import KernelBackend, resolve_backend
from . import naive
from .naive import DEFAULT_BLOCK

__all__ = ["DEFAULT_BLOCK", "TOTAL_FREQUENCY", "frequency_tables"]

_KERNEL_MAX_BLOCK = 4096
"""A kernel program holds one block of float64 values; larger blocks run the reference, which
gives the same table (the block is part of the algorithm, not of the backend)."""


def frequency_tables(
    logits: torch.Tensor,
    *,
    block: int = DEFAULT_BLOCK,
    backend: KernelBackend | None = None,
) -> torch.Tensor:
    """Cumulative tables ``[N, V + 1]`` (int64, from 0 to ``2**32``) of logits ``[N, V]``.

    >>> t = frequency_tables(torch.tensor([[0.0, 0.0]]), backend="torch")
    >>> t.tolist()
    [[0, 2147483648, 4294967296]]
    """
    if logits.dim() != 2 or not 1 <= logits.shape[1] <= MAX_VOCAB:
        raise ValueError(
            f"expected logits [N, V] with 1 <= V <= {MAX_VOCAB}, got shape {tuple(logits.shape)}"
        )
    if not logits.dtype.is_floating_point:
        raise TypeError(f"expected floating-point logits, got {logits.dtype}")
    if block < 2 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 2, got {block}")
    if logits.numel():
        bad = torch.isnan(logits).any() | (logits == torch.inf).any()
        no_peak = (logits.amax(dim=-1) == -torch.inf).any()
        if bool(bad | no_peak):
            raise ValueError(
                "logits must not be NaN or +inf, and every row needs at least one finite value"
            )
    unsupported = None if block <= _KERNEL_MAX_BLOCK else f"block={block} > {_KERNEL_MAX_BLOCK}"
    if resolve_backend(backend, logits, unsupported=unsupported) == "triton":
        from .triton import cumulative_tables as tables_kernel

        return tables_kernel(logits, block)
    return naive.cumulative_tables(logits, block)

"""seqkv's hot paths as Triton kernels, each beside the pure-torch reference it must reproduce.

Motivation: seqkv's per-element work (quantizing a KV cache, forming and rebuilding the
residual, predicting KV from top-k candidates, turning logits into coder tables) is a chain of
small memory-bound torch passes. On a GPU each op here runs as one or two fused kernels. On
every other device, and whenever asked, the torch reference runs instead; it is written for
clarity and is the CPU path.

Layout (as flash-linear-attention's ``ops/<op>/``): one folder per op, ``naive.py`` (reference)
beside ``triton.py`` (kernel), the op's dispatching functions in its ``__init__.py``:

- ``turboquant/``: :func:`turboquant_quantize`, :func:`turboquant_dequantize` (randomized
  Hadamard rotate + Lloyd-Max + bit-pack, and back; arXiv 2504.19874).
- ``kivi/``: :func:`kivi_quantize`, :func:`kivi_dequantize` (arXiv 2402.02750).
- ``residual/``: :func:`residual_quantize`, :func:`residual_dequantize` (``target - prediction``
  at a uniform step of twice the tolerance, as :mod:`seqkv.coding.residual`).
- ``topk_expectation/``: :func:`topk_expectation` (renormalised top-k weighted mean of KV).
- ``frequencies/``: :func:`frequency_tables` (logits to cumulative tables of total ``2**32``).
- ``dispatch.py``: :func:`resolve_backend`, the one place that picks kernel or reference
  (argument ``backend=``, else ``$SEQKV_KERNELS``, else ``"auto"``: Triton for CUDA tensors).
- ``testing.py``: the comparison helper the tests and the GPU check share.

Invariants:
1. ``import seqkv.kernels`` imports neither ``triton`` nor any kernel module (enforced: kernels
   are imported inside the op functions; checked: ``tests/test_kernels_dispatch.py``).
2. Integer outputs (codes, packed bytes, symbols, tables) of a kernel equal its reference's
   exactly; float outputs agree within the tolerances stated in each op's tests (checked:
   ``tests/test_kernels_*.py`` on Triton's CPU interpreter; ``scripts/gpu_check.sh`` on a GPU).
3. No module-level mutable state; the environment is read at call time (enforced).
"""

from .dispatch import (
    ENV_VAR,
    KernelBackend,
    KernelUnavailableError,
    ResolvedBackend,
    resolve_backend,
)
from .frequencies import frequency_tables
from .kivi import kivi_dequantize, kivi_quantize
from .residual import QuantizedResidual, residual_dequantize, residual_quantize
from .topk_expectation import topk_expectation
from .turboquant import turboquant_dequantize, turboquant_quantize

__all__ = [
    "ENV_VAR",
    "KernelBackend",
    "KernelUnavailableError",
    "QuantizedResidual",
    "ResolvedBackend",
    "frequency_tables",
    "kivi_dequantize",
    "kivi_quantize",
    "residual_dequantize",
    "residual_quantize",
    "resolve_backend",
    "topk_expectation",
    "turboquant_dequantize",
    "turboquant_quantize",
]

"""seqkv's quantizer hot paths as Triton kernels, each beside the pure-torch reference that is
the CPU path.

Motivation: quantizing a KV cache and rebuilding it is a chain of small memory-bound torch
passes. On a GPU each op here runs as one or two fused kernels; everywhere else the torch
reference runs, and it is the one CPU implementation of the computation: the quantizers of
:mod:`seqkv.quantizers` call these ops for every quantize and dequantize and hold no torch code
of their own for it. This package is the lower layer: it imports nothing from the quantizers
(they pass plain tensors: rows, codebooks, rotations, group sizes).

Layout (as flash-linear-attention's ``ops/<op>/``): one folder per op, ``naive.py`` (reference)
beside ``triton.py`` (kernel), the op's dispatching functions in its ``__init__.py``:

- ``turboquant/``: :func:`turboquant_quantize`, :func:`turboquant_dequantize` (normalise, rotate
  by the randomized Hadamard transform or an orthogonal matrix, Lloyd-Max bucket, bit-pack; and
  back; arXiv 2504.19874). Used by ``TurboQuantMSE`` and the MSE stage of ``TurboQuantProd``.
- ``kivi/``: :func:`kivi_quantize`, :func:`kivi_dequantize` (group quantization along tokens or
  channels; arXiv 2402.02750). Used by ``KIVI``.
- ``absmax/``: :func:`absmax_quantize`, :func:`absmax_dequantize` (per-vector absmax scale,
  int8 or fp8 e4m3 codes). Used by ``Int8Absmax`` and ``FP8E4M3``.
- ``topk_expectation/``: :func:`topk_expectation` (renormalised top-k weighted mean of KV), the
  arithmetic of the top-k predictor of ``seqkv.delta.predictors``.
- ``common/``: the building blocks the ops share (bit packing, fixed-order sums, the
  Walsh-Hadamard butterfly, exact fp16 rounding), each as torch and as a device function.
- ``dispatch.py``: :func:`resolve_backend`, the one place that picks kernel or reference
  (argument ``backend=``, else ``$SEQKV_KERNELS``, else ``"auto"``: Triton for CUDA tensors).
- ``testing.py``: the comparison helper the tests and the GPU check share.

Invariants:
1. ``import seqkv.kernels`` imports neither ``triton`` nor any kernel module (enforced: each op
   imports its ``triton.py`` after dispatch chose it; checked: ``tests/test_kernels_dispatch.py``).
2. Nothing in this package imports :mod:`seqkv.quantizers` (enforced; checked:
   ``tests/test_kernels_dispatch.py`` inspects the imports).
3. Integer outputs (codes, packed bytes, scales) of a kernel equal its reference's exactly,
   except TurboQuant's orthogonal rotation, whose codes may differ within float32 rounding of a
   threshold; float outputs agree within the tolerances stated in each op's tests (checked:
   ``tests/test_kernels_*.py`` on Triton's CPU interpreter; ``scripts/gpu_check.sh`` on a GPU).
4. No module-level mutable state; the environment is read at call time (enforced).
"""

from .absmax import AbsmaxFormat, absmax_dequantize, absmax_quantize
from .dispatch import (
    ENV_VAR,
    KernelBackend,
    KernelUnavailableError,
    ResolvedBackend,
    UnsupportedKernelInputError,
    resolve_backend,
)
from .kivi import GroupAxis, kivi_dequantize, kivi_quantize
from .topk_expectation import topk_expectation
from .turboquant import RotationOperand, turboquant_dequantize, turboquant_quantize

__all__ = [
    "ENV_VAR",
    "AbsmaxFormat",
    "GroupAxis",
    "KernelBackend",
    "KernelUnavailableError",
    "ResolvedBackend",
    "RotationOperand",
    "UnsupportedKernelInputError",
    "absmax_dequantize",
    "absmax_quantize",
    "kivi_dequantize",
    "kivi_quantize",
    "resolve_backend",
    "topk_expectation",
    "turboquant_dequantize",
    "turboquant_quantize",
]

"""TurboQuant_mse (arXiv 2504.19874, Algorithm 1): fused quantize (normalise + rotate +
Lloyd-Max bucket + bit-pack) and dequantize (unpack + lookup + inverse rotation + norm).

Motivation: TurboQuant is the per-vector quantizer seqkv composes with and is measured against;
:class:`seqkv.quantizers.TurboQuantMSE` (and the MSE stage of ``TurboQuantProd``) call these two
functions for every quantize and dequantize, so the reference (``naive.py``) is their CPU path
and the kernel (``triton.py``) their GPU path. The ops take plain tensors (rows, codebook
thresholds or levels, a rotation) and know nothing of the quantizers: the quantizer owns the
codebook, the rotation's seed, shapes and the stored format.

Invariants:
1. Both backends return identical packed codes and norms for the Hadamard rotation; for the
   orthogonal rotation identical norms and codes except within float32 rounding of a threshold
   (checked: ``tests/test_kernels_turboquant.py`` on Triton's interpreter,
   ``scripts/gpu_check.sh`` on a GPU).
2. Norms come back as float32; the caller rounds them to its storage type (enforced: the op
   returns what the kernel computed).
3. Unsupported configurations (a dim outside the kernel's range) run the reference under
   ``"auto"`` and raise :class:`~seqkv.kernels.dispatch.UnsupportedKernelInputError` when Triton
   is forced (enforced by :func:`~seqkv.kernels.dispatch.resolve_backend`).
"""

from __future__ import annotations

import torch

from seqkv.errors import InvalidTensorError, QuantizerConfigError

from ..common.bitpack import check_bits, packed_nbytes
from ..dispatch import KernelBackend, resolve_backend
from . import naive
from .naive import RotationOperand, rotation_dim

__all__ = ["RotationOperand", "turboquant_dequantize", "turboquant_quantize"]

_HADAMARD_DIMS = (8, 1024)
_MATRIX_DIMS = (16, 128)


def _kernel_unsupported(rotation: RotationOperand, dim: int) -> str | None:
    low, high = _MATRIX_DIMS if rotation.matrix is not None else _HADAMARD_DIMS
    if low <= dim <= high and dim & (dim - 1) == 0:
        return None
    kind = "orthogonal" if rotation.matrix is not None else "Hadamard"
    return (
        f"head dimension {dim} with the {kind} rotation is not a power of two in {low}..{high}; "
        "use backend='torch'"
    )


def _check_rotation(rotation: RotationOperand) -> int:
    if (rotation.matrix is None) == (rotation.signs is None):
        raise QuantizerConfigError("a TurboQuant rotation holds exactly one of signs and matrix")
    dim = rotation_dim(rotation)
    if rotation.signs is not None and dim & (dim - 1):
        raise QuantizerConfigError(f"the Hadamard rotation needs a power-of-two dim, got {dim}")
    return dim


def _check_codebook(table: torch.Tensor, bits: int, size: int, what: str) -> None:
    check_bits(bits)
    if table.shape != (size,):
        raise QuantizerConfigError(f"{what} for {bits}-bit codes must have shape ({size},), got "
                                   f"{tuple(table.shape)}")


def turboquant_quantize(
    x: torch.Tensor,
    rotation: RotationOperand,
    thresholds: torch.Tensor,
    bits: int,
    *,
    backend: KernelBackend | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[N, D]`` to packed ``bits``-bit codes (uint8, ``ceil(N * D * bits / 8)`` bytes in
    :mod:`seqkv.kernels.common.bitpack`'s format) and their float32 norms ``[N]``.

    ``thresholds`` are the ``2**bits - 1`` increasing decision boundaries of the codebook.

    >>> from types import SimpleNamespace
    >>> hadamard = SimpleNamespace(signs=torch.ones(16), matrix=None)
    >>> thresholds = torch.tensor([-0.2, 0.0, 0.2])  # 2 bits: 3 boundaries
    >>> packed, norms = turboquant_quantize(torch.randn(5, 16), hadamard, thresholds, 2)
    >>> packed.numel(), norms.shape
    (20, torch.Size([5]))
    """
    dim = _check_rotation(rotation)
    if x.dim() != 2 or x.shape[1] != dim or not x.dtype.is_floating_point:
        raise InvalidTensorError(f"expected floating-point rows [N, {dim}], got {x.dtype} "
                                 f"{tuple(x.shape)}")
    _check_codebook(thresholds, bits, (1 << bits) - 1, "thresholds")
    chosen = resolve_backend(backend, x, unsupported=_kernel_unsupported(rotation, dim))
    if chosen == "triton":
        # NOTE: imported here, after dispatch chose Triton: importing seqkv.kernels must not
        # import triton (seqkv.kernels.dispatch, invariant 1).
        from . import triton as kernel

        return kernel.encode(x, rotation, thresholds, bits)
    return naive.encode(x, rotation, thresholds, bits)


def turboquant_dequantize(
    packed: torch.Tensor,
    norms: torch.Tensor,
    rotation: RotationOperand,
    levels: torch.Tensor,
    bits: int,
    dtype: torch.dtype,
    *,
    backend: KernelBackend | None = None,
) -> torch.Tensor:
    """Packed codes of ``N`` vectors and their norms ``[N]`` (float16 or float32) back to rows
    ``[N, D]`` of ``dtype``; ``levels`` are the codebook's ``2**bits`` reconstruction points.
    """
    dim = _check_rotation(rotation)
    _check_codebook(levels, bits, 1 << bits, "levels")
    if norms.dim() != 1:
        raise InvalidTensorError(f"norms must be 1-D [N], got shape {tuple(norms.shape)}")
    need = packed_nbytes(norms.shape[0] * dim, bits)
    if packed.dtype != torch.uint8 or packed.shape != (need,):
        raise InvalidTensorError(f"{norms.shape[0]} vectors of {dim} {bits}-bit codes need {need} "
                                 f"packed bytes (uint8), got {packed.dtype} {tuple(packed.shape)}")
    chosen = resolve_backend(backend, packed, unsupported=_kernel_unsupported(rotation, dim))
    if chosen == "triton":
        from . import triton as kernel

        return kernel.decode(packed, norms, rotation, levels, bits, dtype)
    return naive.decode(packed, norms, rotation, levels, bits, dtype)

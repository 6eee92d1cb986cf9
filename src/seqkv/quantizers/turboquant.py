"""TurboQuant (Zandieh, Daliri, Hadian, Mirrokni; arXiv 2504.19874): rotate, then scalar-quantize.

Motivation: a per-vector quantizer with near-optimal distortion and no per-block scales. It is
both a baseline seqkv is measured against and the quantizer seqkv's residual coder composes with.

``TurboQuantMSE`` (the paper's Algorithm 1, TurboQuant_mse), for each vector ``x`` of dim ``d``:
store ``||x||`` in fp16; rotate ``y = R x / ||x||`` with a fixed seeded random rotation ``R``
(:mod:`seqkv.quantizers.rotation`); quantize every coordinate of ``y`` with the ``b``-bit
Lloyd-Max codebook for the law of a unit vector's coordinate (:mod:`seqkv.quantizers.lloyd_max`);
dequantize by codebook lookup, ``R^T``, times the norm. Expected distortion for unit vectors
``E||x - xhat||^2``: 0.358, 0.115, 0.033, 0.009 at ``d = 64`` and ``b = 1..4``.

``TurboQuantProd`` (Algorithm 2, TurboQuant_prod): ``b - 1`` bits of TurboQuant_mse on the unit
vector ``u = x / ||x||``, then a 1-bit QJL sketch of the residual ``r = u - uhat_mse``: store
``sign(S r)`` for a seeded ``d x d`` standard Gaussian ``S`` and ``||r||`` (fp16). Dequantize:
``xhat = ||x|| (uhat_mse + ||r|| sqrt(pi/2) / d * S^T sign(S r))``, so for any query ``y``,
``<y, xhat> = <y, xhat_mse> + ||x|| ||r|| sqrt(pi/2)/d <S y, sign(S r)>`` is an unbiased estimate of
``<y, x>`` over the draw of ``S`` (``E[(s.y) sign(s.r)] = sqrt(2/pi) <y, r> / ||r||`` for a
Gaussian row ``s``). Its variance is ``||x||^2 ||r||^2 (pi/2 ||y||^2 - <y, r/||r||>^2) / d``,
which for unit ``x``, ``y`` gives the paper's inner-product distortion ``~ (pi/2) D_mse(b-1) / d``:
1.57/d, 0.56/d, 0.18/d, 0.047/d at b = 1..4 (the paper rounds ``D_mse(3)`` to 0.03; with the exact
0.033-0.034 the last figure is ~0.053/d, which is what ``tests/test_quantizers_turboquant.py``
measures).

Bits per component: ``b + 16/d`` (MSE) and ``b + 32/d`` (prod), each packed code stream padded to
a whole byte.

Where it runs: the normalise-rotate-bucket-pack chain and its inverse are the kernel op
:mod:`seqkv.kernels.turboquant` (its torch reference on a CPU, its fused Triton kernel on a GPU);
this module owns the configuration (codebook, seeded rotation and QJL matrix), the input checks,
the stored format and the QJL stage, whose projection is a library matrix product.

NOTE: what moved when the kernel reference became the CPU path (measured on this project's
CPU). The reference computes a norm as the correctly rounded root of a pairwise tree sum of
squares (where ``torch.linalg.vector_norm`` fixes no summation order) and scales the Hadamard
butterfly by ``float32(1 / sqrt(d))`` (where the former code divided by ``sqrt(d)``; identical
when ``d`` is a power of four). On 20,000 random vectors per head dim 64, 128 and 96 and every
width 1..4: 1 fp16 norm in 20,000 changed (the two float32 norms straddled an fp16 rounding
boundary), at most 1 code in 480,000 (a rotated coordinate on a threshold), up to 10 QJL sign
bits in 320,000 for prod, and Hadamard reconstructions at d = 128 in their last float32 bit.
Every figure the project reports stayed identical to the printed digit: ``python -m
research.bench quant --no-sweep --json`` (byte-identical output, both head dims), the distortion
and MSE table of ``python benchmarks/bench_quantizers.py --figures``, and every stored bit count.

Invariants:
1. For a fixed seed the quantizer is a deterministic function of its input; the rotation and
   ``S`` come from one ``torch.Generator(seed)`` (rotation drawn first, then ``S``), so
   ``TurboQuantProd(d, b, rot, seed)``'s MSE stage equals ``TurboQuantMSE(d, b - 1, rot, seed)``
   (enforced by construction; checked by a test).
2. Norms are stored in fp16 and dequantization uses the stored (rounded) values (enforced:
   the decoder reads only what :class:`QuantizedTensor` holds).
3. Unbiasedness of ``TurboQuantProd`` holds in expectation over seeds, not for one fixed ``S``
   (checked: a test averages over 64 seeds).
4. Zero vectors quantize to zero (enforced: normalisation divides by ``max(||x||, tiny)``).
5. The MSE stage of both classes is exactly what the kernel op computes: one implementation per
   device (checked: ``tests/test_kernels_wiring.py`` spies on the op's two implementations).

Deviations from the paper:
- The paper assumes unit vectors and says to store the norm separately for others; here the norm
  is always stored, in fp16, and counted (16 bits per vector, 32 for prod with ``||r||``).
- ``rotation="hadamard"`` replaces the Haar rotation by one randomized Hadamard transform (the
  "fast variant"); the coordinate law is then exact only for inputs that are themselves random.
- With ``b = 1`` the prod variant has no MSE stage (``codes is None``): the whole budget is QJL.
- QJL's residual is formed in the original (unrotated) basis, ``r = u - R^T yhat``, as in the
  paper's Algorithm 2.
"""

from __future__ import annotations

import math

import torch

from seqkv.errors import InvalidTensorError, QuantizerConfigError
from seqkv.kernels import turboquant_dequantize, turboquant_quantize
from seqkv.kernels.common.bitpack import check_bits, packed_nbytes
from seqkv.kernels.common.naive import to_fp16, vector_norms
from seqkv.kernels.turboquant.naive import unit_rows
from seqkv.quantizers.base import (
    PackedCodes,
    QuantizedTensor,
    QuantizerName,
    check_code_bits,
    check_input,
    check_owner,
)
from seqkv.quantizers.lloyd_max import CoordinateLaw, ScalarCodebook, lloyd_max_codebook
from seqkv.quantizers.rotation import Rotation, RotationKind


def _check_dim(dim: int) -> None:
    if dim < 2:
        raise QuantizerConfigError(f"dim must be at least 2, got {dim}")


def _encode(rows: torch.Tensor, rotation: Rotation, codebook: ScalarCodebook
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed codes of rows ``[N, D]`` and their float32 norms ``[N]`` (the kernel op)."""
    thresholds = codebook.thresholds_tensor(rows.device)
    return turboquant_quantize(rows, rotation, thresholds, codebook.bits)


def _decode(codes: PackedCodes, norms: torch.Tensor, rotation: Rotation,
            codebook: ScalarCodebook, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``[N, D]`` of ``dtype`` from packed codes and norms ``[N]`` (the kernel op)."""
    levels = codebook.levels_tensor(codes.data.device)
    return turboquant_dequantize(codes.data, norms, rotation, levels, codebook.bits, dtype)


class TurboQuantMSE:
    """TurboQuant_mse at ``bits`` bits per coordinate (arXiv 2504.19874, Algorithm 1).

    Stores: ``codes`` (``bits`` bits per component), ``scales`` (fp16 ``||x||`` per vector).

    >>> q = TurboQuantMSE(dim=64, bits=3, seed=0)
    >>> x = torch.randn(2, 4, 10, 64)
    >>> qx = q.quantize(x)
    >>> qx.num_bits == 2 * 4 * 10 * (64 * 3 + 16)
    True
    >>> q.dequantize(qx).shape
    torch.Size([2, 4, 10, 64])
    """

    def __init__(
        self,
        dim: int,
        bits: int,
        rotation: RotationKind = "orthogonal",
        seed: int = 0,
        law: CoordinateLaw = "sphere",
    ) -> None:
        _check_dim(dim)
        check_bits(bits)
        self._dim = dim
        self._bits = bits
        generator = torch.Generator().manual_seed(seed)
        self.rotation = Rotation.draw(dim, rotation, generator)
        self.codebook = lloyd_max_codebook(dim, bits, law)

    @property
    def name(self) -> QuantizerName:
        return "turboquant_mse"

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def bits(self) -> int:
        return self._bits

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        check_input(x, self._dim)
        rows = x.reshape(-1, self._dim)  # [N, D]
        packed, norms = _encode(rows, self.rotation, self.codebook)
        return QuantizedTensor(
            method=self.name,
            shape=tuple(x.shape),
            dtype=x.dtype,
            codes=PackedCodes(data=packed, bits=self._bits, shape=tuple(x.shape)),
            scales=to_fp16(norms, "vector norm").reshape(x.shape[:-1]),  # [..., T]
        )

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor:
        check_owner(q, self.name, self._dim)
        check_code_bits(q.codes, self._bits, "codes")
        assert q.codes is not None and q.scales is not None
        rows = _decode(q.codes, q.scales.reshape(-1), self.rotation, self.codebook, q.dtype)
        return rows.reshape(q.shape)  # [..., T, D]

    def num_bits_for(self, shape: tuple[int, ...]) -> int:
        n_vectors = math.prod(shape[:-1])
        return 8 * packed_nbytes(n_vectors * self._dim, self._bits) + 16 * n_vectors


class TurboQuantProd:
    """TurboQuant_prod at ``bits`` bits per coordinate (arXiv 2504.19874, Algorithm 2).

    ``bits - 1`` bits of :class:`TurboQuantMSE` plus a 1-bit QJL sketch of the residual.
    Stores: ``codes`` (``bits - 1`` bits per component; ``None`` at ``bits = 1``), ``sketch``
    (1 bit per component), ``scales`` (fp16 ``||x||``), ``residual_norms`` (fp16 ``||r||``).

    >>> q = TurboQuantProd(dim=64, bits=3, seed=0)
    >>> keys, query = torch.randn(1, 100, 64), torch.randn(1, 1, 64)
    >>> q.inner_product(query, q.quantize(keys)).shape
    torch.Size([1, 1, 100])
    """

    def __init__(
        self,
        dim: int,
        bits: int,
        rotation: RotationKind = "orthogonal",
        seed: int = 0,
        law: CoordinateLaw = "sphere",
    ) -> None:
        _check_dim(dim)
        check_bits(bits)
        self._dim = dim
        self._bits = bits
        generator = torch.Generator().manual_seed(seed)
        self.rotation = Rotation.draw(dim, rotation, generator)
        self.projection = torch.randn(dim, dim, generator=generator, dtype=torch.float32)
        """``S``: ``[D, D]`` standard Gaussian (the QJL matrix)."""
        self.codebook = lloyd_max_codebook(dim, bits - 1, law) if bits > 1 else None

    @property
    def name(self) -> QuantizerName:
        return "turboquant_prod"

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def bits(self) -> int:
        return self._bits

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        check_input(x, self._dim)
        rows = x.reshape(-1, self._dim)  # [N, D]
        packed: PackedCodes | None = None
        if self.codebook is not None:
            data, norms = _encode(rows, self.rotation, self.codebook)  # [bytes], [N]
            packed = PackedCodes(data=data, bits=self._bits - 1, shape=tuple(x.shape))
            ones = torch.ones_like(norms)
            mse = _decode(packed, ones, self.rotation, self.codebook, torch.float32)  # [N, D]
            unit = unit_rows(rows.to(torch.float32), norms)  # [N, D]
            residual = unit - mse
        else:
            norms = vector_norms(rows.to(torch.float32))  # [N]
            residual = unit_rows(rows.to(torch.float32), norms)
        residual_norms = vector_norms(residual)  # [N]
        projected = residual @ self.projection.to(residual.device).T  # [N, D]: S r
        signs = (projected >= 0).to(torch.uint8)  # 1 is +1, 0 is -1
        return QuantizedTensor(
            method=self.name,
            shape=tuple(x.shape),
            dtype=x.dtype,
            codes=packed,
            scales=to_fp16(norms, "vector norm").reshape(x.shape[:-1]),  # [..., T]
            sketch=PackedCodes.pack(signs.reshape(x.shape), 1),  # [..., T, D]
            residual_norms=to_fp16(residual_norms, "residual norm").reshape(x.shape[:-1]),
        )

    def _unpack(self, q: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``norm * uhat_mse`` ``[N, D]``, ``sign(S r)`` as +-1 ``[N, D]``, and the QJL
        coefficient ``norm * ||r|| * sqrt(pi/2) / d`` ``[N]``."""
        check_owner(q, self.name, self._dim)
        check_code_bits(q.codes, self._bits - 1 if self._bits > 1 else None, "codes")
        check_code_bits(q.sketch, 1, "sketch")
        assert q.sketch is not None and q.scales is not None and q.residual_norms is not None
        norms = q.scales.reshape(-1)  # [N]
        if q.codes is None or self.codebook is None:
            mse = torch.zeros(norms.shape[0], self._dim, device=norms.device)  # [N, D]
        else:
            mse = _decode(q.codes, norms, self.rotation, self.codebook, torch.float32)
        norms = norms.to(torch.float32)
        signs = q.sketch.unpack().reshape(-1, self._dim).to(torch.float32) * 2.0 - 1.0  # [N, D]
        coef = norms * q.residual_norms.reshape(-1).to(torch.float32)  # [N]
        return mse, signs, coef * (math.sqrt(math.pi / 2.0) / self._dim)

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor:
        """The unbiased reconstruction ``xhat_mse + ||x|| ||r|| sqrt(pi/2)/d S^T sign(S r)``."""
        mse, signs, coef = self._unpack(q)
        qjl = (signs @ self.projection.to(signs.device)) * coef.unsqueeze(-1)  # [N, D]: S^T z
        return (mse + qjl).reshape(q.shape).to(q.dtype)  # [..., T, D]

    def inner_product(self, query: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
        """Unbiased estimates of ``<query_m, x_t>`` for queries ``[..., M, D]`` and ``q`` of
        ``x`` ``[..., T, D]`` (leading dims broadcast): returns ``[..., M, T]``, like ``Q K^T``.
        """
        check_input(query, self._dim, min_ndim=2)
        if len(q.shape) < 2:
            raise InvalidTensorError(f"q must hold a [..., T, D] tensor, got shape {q.shape}")
        mse, signs, coef = self._unpack(q)
        keys_shape = q.shape
        mse = mse.reshape(keys_shape)  # [..., T, D]
        signs = signs.reshape(keys_shape)  # [..., T, D]
        coef = coef.reshape(keys_shape[:-1])  # [..., T]
        qf = query.to(torch.float32)  # [..., M, D]
        sq = qf @ self.projection.to(qf.device).T  # [..., M, D]: S y
        mse_term = qf @ mse.transpose(-1, -2)  # [..., M, T]
        qjl_term = (sq @ signs.transpose(-1, -2)) * coef.unsqueeze(-2)  # [..., M, T]
        return (mse_term + qjl_term).to(query.dtype)

    def num_bits_for(self, shape: tuple[int, ...]) -> int:
        n_vectors = math.prod(shape[:-1])
        n = n_vectors * self._dim
        mse_bits = 8 * packed_nbytes(n, self._bits - 1) if self._bits > 1 else 0
        return mse_bits + 8 * packed_nbytes(n, 1) + 32 * n_vectors

"""Closed-loop delta coding of many equal-length KV segments at once: the warm tier's engine.

Motivation: ``seqkv.delta.encode_delta`` walks one session position by position, which is right
for a study and far too slow for a serving engine (8,192 positions, each a Python step). A
predictor that needs no model lets every position of a *step* be coded together, and segments
(a serving engine's KV blocks) of equal length be coded together too. For a segment of ``T``
positions the steps are:

- ``NoPrediction``: one step, all positions, prediction zero;
- ``PreviousToken(G, "previous")``: ``G`` steps; step ``j`` codes positions ``j, j + G, ...``
  against the decoded position before each (step 0, the anchors, against zero);
- ``PreviousToken(G, "anchor")``: two steps; the anchors against zero, then every other
  position against its group's decoded anchor.

This is the same closed loop as ``encode_delta`` (``seqkv.delta.closed_loop``, one loop step per
step here: each prediction is a decoded value, so quantization error does not accumulate),
reordered so positions that do not depend on each other share one quantizer call. The stored
form of a segment is, for each step in order, each stored field of the quantizer's output
(packed codes, then fp16 side tensors, in ``QuantizedTensor`` field order) as raw bytes: nothing
else, so its length is fixed by the config and the geometry.

Invariants:
1. Segment ``i`` of a batch stores exactly what coding it alone would store, up to float
   rounding of the batched products (enforced: a batch is cut along its leading dimension only
   where every packed stream ends on a byte; otherwise segments are coded one at a time).
2. ``decode`` rebuilds from the stored bytes only, with the encoder's step order, and returns
   what ``encode`` returned as decoded when called with the same batch, bit for bit, signed
   zeros included (enforced: both run ``seqkv.delta.closed_loop``; checked:
   ``tests/test_warm.py``, ``tests/test_delta_closed_loop.py``).
3. A payload whose length is not the one the config and geometry fix, or whose values dequantize
   to NaN or infinity, is refused (enforced: ``CorruptFileError``); the caller never gets KV
   from it.
4. Input KV is ``[segments, layers, 2, kv_heads, T, head_dim]``, finite (enforced).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from seqkv.delta.closed_loop import decode_loop, encode_loop
from seqkv.delta.predictors import PreviousToken
from seqkv.delta.residual_coder import make_residual_quantizer
from seqkv.errors import CorruptFileError, InvalidKVError
from seqkv.quantizers import PackedCodes, QuantizedTensor, Quantizer
from seqkv.types import KVGeometry
from seqkv.warm.config import WarmConfig


@dataclass(frozen=True)
class Step:
    """The positions one quantizer call codes, and the decoded positions predicting them."""

    positions: torch.Tensor
    """``[P]`` long, increasing."""
    references: torch.Tensor | None
    """``[P]`` long, each ``< `` its position; ``None``: predicted as zero."""


@dataclass(frozen=True)
class _Field:
    """One stored field of a step's quantizer output, per segment."""

    name: str
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    """Per segment (the batch dimension left out)."""
    bits: int
    """Code width for packed codes; 0 for a side tensor."""


def steps_for(config: WarmConfig, num_tokens: int) -> tuple[Step, ...]:
    """The step order of ``config`` over ``num_tokens`` positions.

    >>> [s.positions.tolist() for s in steps_for(WarmConfig(PreviousToken(2)), 5)]
    [[0, 2, 4], [1, 3]]
    >>> steps_for(WarmConfig(PreviousToken(2, "anchor")), 5)[1].references.tolist()
    [0, 2]
    """
    every = torch.arange(num_tokens)
    predictor = config.predictor
    if not isinstance(predictor, PreviousToken) or predictor.group_size == 1:
        return (Step(every, None),)
    group = predictor.group_size
    anchors = Step(every[::group], None)
    if predictor.reference == "anchor":
        rest = every[every % group != 0]
        return (anchors, Step(rest, (rest // group) * group)) if rest.numel() else (anchors,)
    out = [anchors]
    for offset in range(1, min(group, num_tokens)):
        positions = every[offset::group]
        out.append(Step(positions, positions - 1))
    return tuple(out)


def _stored(q: QuantizedTensor) -> list[tuple[str, PackedCodes | torch.Tensor]]:
    """The fields of ``q`` that hold data, in declaration order."""
    out: list[tuple[str, PackedCodes | torch.Tensor]] = []
    for f in fields(q):
        value = getattr(q, f.name)
        if isinstance(value, PackedCodes | torch.Tensor):
            out.append((f.name, value))
    return out


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's bytes in row-major order (little-endian, as torch holds them here)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


class _StepPredictor:
    """The closed loop's predictor of a step order: a step's references' decoded values (zero
    for a step without references), each step's decoded values written into ``decoded``."""

    def __init__(self, codec: WarmCodec, decoded: torch.Tensor) -> None:
        self.codec = codec
        self.decoded = decoded  # [n, L, 2, H, T, D]

    def predict(self, index: int) -> torch.Tensor:
        step = self.codec.steps[index]
        if step.references is None:
            return torch.zeros(self.codec._step_shape(self.decoded.shape[0], step))
        return self.decoded[..., step.references, :]  # [n, L, 2, H, P, D]

    def observe(self, index: int, decoded: torch.Tensor) -> None:
        self.decoded[..., self.codec.steps[index].positions, :] = decoded


class _SameQuantizer:
    """The closed loop's quantizer when every step is coded at one width."""

    def __init__(self, quantizer: Quantizer) -> None:
        self.quantizer = quantizer

    def quantize(self, step: int, residual: torch.Tensor) -> QuantizedTensor:
        return self.quantizer.quantize(residual)

    def dequantize(self, step: int, code: QuantizedTensor) -> torch.Tensor:
        return self.quantizer.dequantize(code)


class WarmCodec:
    """Codes and decodes segments of ``num_tokens`` positions under one config and geometry.

    Holds the quantizer (its rotation and codebook) and each step's field layout, built once.

    >>> codec = WarmCodec(WarmConfig(), KVGeometry(2, 2, 16), num_tokens=4)
    >>> kv = torch.randn(3, 2, 2, 2, 4, 16)   # [segments, L, 2, H, T, D]
    >>> payloads, decoded = codec.encode(kv)
    >>> len(payloads), len(payloads[0]) == codec.payload_bytes
    (3, True)
    >>> torch.equal(codec.decode(payloads), decoded)
    True
    """

    def __init__(self, config: WarmConfig, geometry: KVGeometry, num_tokens: int) -> None:
        if num_tokens < 1:
            raise InvalidKVError(f"a warm segment holds at least one position, got {num_tokens}")
        self.config = config
        self.geometry = geometry
        self.num_tokens = num_tokens
        self.steps = steps_for(config, num_tokens)
        self.quantizer: Quantizer = make_residual_quantizer(
            config.quantizer, geometry.head_dim, config.bits, config.seed)
        self._templates: list[QuantizedTensor] = []
        self._layouts: list[list[_Field]] = []
        for step in self.steps:
            zeros = torch.zeros(self._step_shape(1, step))
            template = self.quantizer.quantize(zeros)
            layout = []
            for name, value in _stored(template):
                if isinstance(value, PackedCodes):
                    layout.append(_Field(name, value.data.numel(), torch.uint8,
                                         value.shape[1:], value.bits))
                else:
                    layout.append(_Field(name, value.numel() * value.element_size(),
                                         value.dtype, tuple(value.shape[1:]), 0))
            self._templates.append(template)
            self._layouts.append(layout)
        self.payload_bytes = sum(f.nbytes for layout in self._layouts for f in layout)
        """Stored bytes of one segment."""
        self.code_bytes = sum(f.nbytes for layout in self._layouts for f in layout if f.bits)
        """Of which packed codes (the rest is side information)."""

    def _step_shape(self, segments: int, step: Step) -> tuple[int, ...]:
        g = self.geometry
        return (segments, g.layers, 2, g.kv_heads, int(step.positions.numel()), g.head_dim)

    def _batchable(self, layout: Sequence[_Field]) -> bool:
        """Whether every packed stream of one segment ends on a byte (invariant 1)."""
        for f in layout:
            count = 1
            for size in f.shape:
                count *= size
            if f.bits and count * f.bits % 8:
                return False
        return True

    def _check(self, kv: torch.Tensor) -> torch.Tensor:
        g = self.geometry
        expected = (g.layers, 2, g.kv_heads, self.num_tokens, g.head_dim)
        if kv.dim() != 6 or tuple(kv.shape[1:]) != expected:
            shape = ", ".join(map(str, expected))
            raise InvalidKVError(
                f"warm segments have shape {tuple(kv.shape)}; this codec codes "
                f"[segments, layers, 2, kv_heads, tokens, head_dim] = [n, {shape}]"
            )
        kv = kv.detach().to("cpu", torch.float32)
        if not bool(torch.isfinite(kv).all()):
            raise InvalidKVError(
                "the KV holds NaN or infinite values: a warm entry needs finite KV")
        return kv

    def encode(self, kv: torch.Tensor) -> tuple[list[bytes], torch.Tensor]:
        """Each segment's stored bytes, and the KV the decoder will rebuild (same shape)."""
        kv = self._check(kv)
        if not all(self._batchable(layout) for layout in self._layouts) and kv.shape[0] > 1:
            parts = [self.encode(kv[i : i + 1]) for i in range(kv.shape[0])]
            return [p[0][0] for p in parts], torch.cat([p[1] for p in parts])
        segments = kv.shape[0]
        decoded = torch.empty_like(kv)  # [n, L, 2, H, T, D]
        chunks: list[list[bytes]] = [[] for _ in range(segments)]
        loop = encode_loop(len(self.steps), lambda s: kv[..., self.steps[s].positions, :],
                           _StepPredictor(self, decoded), _SameQuantizer(self.quantizer))
        for coded in loop:  # each [n, L, 2, H, P, D]
            for (name, value), f in zip(_stored(coded.code), self._layouts[coded.step],
                                        strict=True):
                assert name == f.name
                data = _tensor_bytes(value.data if isinstance(value, PackedCodes) else value)
                for i in range(segments):
                    chunks[i].append(data[i * f.nbytes : (i + 1) * f.nbytes])
        return [b"".join(c) for c in chunks], decoded

    def decode(self, payloads: Sequence[bytes]) -> torch.Tensor:
        """``[segments, layers, 2, kv_heads, T, head_dim]`` float32 from stored payloads."""
        for index, payload in enumerate(payloads):
            if len(payload) != self.payload_bytes:
                raise CorruptFileError(
                    f"warm payload {index} has {len(payload):,} bytes; its config and geometry "
                    f"fix {self.payload_bytes:,}: it is damaged, recompute the KV"
                )
        if not payloads:
            raise InvalidKVError("there are no warm payloads to decode")
        if not all(self._batchable(layout) for layout in self._layouts) and len(payloads) > 1:
            return torch.cat([self.decode([p]) for p in payloads])
        segments = len(payloads)
        g = self.geometry
        out = torch.empty(segments, g.layers, 2, g.kv_heads, self.num_tokens, g.head_dim)
        starts = [0]
        for layout in self._layouts:
            starts.append(starts[-1] + sum(f.nbytes for f in layout))

        def code(index: int) -> QuantizedTensor:
            """Step ``index``'s quantizer output, read from every payload."""
            values: dict[str, PackedCodes | torch.Tensor] = {}
            offset = starts[index]
            for f in self._layouts[index]:
                joined = b"".join(p[offset : offset + f.nbytes] for p in payloads)
                offset += f.nbytes
                raw = (torch.frombuffer(bytearray(joined), dtype=torch.uint8) if joined
                       else torch.empty(0, dtype=torch.uint8))
                if f.bits:
                    values[f.name] = PackedCodes(raw, f.bits, (segments, *f.shape))
                else:
                    values[f.name] = raw.view(f.dtype).reshape(segments, *f.shape)
            for value in values.values():
                if isinstance(value, torch.Tensor) and not bool(torch.isfinite(value).all()):
                    raise CorruptFileError(
                        "a warm payload holds a NaN or infinite scale: it is damaged, recompute "
                        "the KV")
            shape = self._step_shape(segments, self.steps[index])
            return replace(self._templates[index], shape=shape,
                           **values)  # type: ignore[arg-type]

        for _ in decode_loop(len(self.steps), code, _StepPredictor(self, out),
                             _SameQuantizer(self.quantizer)):
            pass  # the predictor writes each step's positions into ``out``
        # NOTE: codes index finite codebooks and the scales were checked above; only fp8 codes
        # can name NaN themselves (e4m3's 0x7f and 0xff).
        if self.config.quantizer == "fp8" and not bool(torch.isfinite(out).all()):
            raise CorruptFileError(
                "a warm payload dequantizes to NaN or infinity: it is damaged, recompute the KV"
            )
        return out

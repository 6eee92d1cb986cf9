"""The KV residual: what recomputation does not reproduce, quantized at a tolerance and coded.

The decoder rebuilds KV by running the model over the decoded tokens. A KV cache that a caller
passes in was usually made under another schedule (one prefill), and differs from that
recomputation in the last bits (up to 7.1e-5 on SmolLM2-135M, CPU: reports/residual_drift.md).
This module stores the difference:

- ``tolerance > 0``: symbol = round((target - recomputed) / (2 * tolerance)); decoded value =
  recomputed + symbol * 2 * tolerance.
- ``tolerance == 0`` (bit-exact): symbol = difference of the two float32 values as ordered
  integers (the number of representable floats between them); decoding is exact to the bit.

Symbols are coded with constriction's range coder under a quantized Laplace law whose scale is
fitted per (layer, key/value) group and stored; a group whose symbols are all zero costs nothing.

Invariants:
1. Every decoded element is within ``tolerance`` of the target, or equal to it in bit-exact mode
   (enforced: an element whose float32 reconstruction misses the bound, or whose symbol falls
   outside the alphabet, is an escape that stores the target's exact bits).
2. Decoding is a pure function of the recomputed tensor and the code (enforced; the codec checks
   the result against a checksum taken at encode time).
3. With ``canonical`` (the codec asks it of a ``.skv`` format-5 file and a fresh encode), the
   decoder accepts only the code the encoder writes for the symbols it decodes to: a group is
   used exactly when its symbols are not all 0, with the scale fitted to them, and the range
   coder's words are those of re-encoding them (enforced: one encode of the used groups). Older
   files are decoded as their writers wrote them, unchecked.
"""

from __future__ import annotations

import constriction
import numpy as np
import torch

from seqkv.coding.residual_code import (
    ALPHABET_LIMIT,
    MAX_TOLERANCE,
    MIN_SCALE,
    MIN_TOLERANCE,
    ResidualCode,
    ResidualMode,
    is_tolerance,
)
from seqkv.errors import CorruptFileError, InvalidKVError, InvalidToleranceError

_ESCAPE = ALPHABET_LIMIT


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 such that the order of integers is the order of floats (-0.0 < +0.0)."""
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -1 - (bits & 0x7FFFFFFF), bits)


def _from_ordered(ordered: torch.Tensor) -> torch.Tensor:
    bits = torch.where(ordered < 0, (-1 - ordered) | -0x80000000, ordered)
    return bits.to(torch.int32).view(torch.float32)


def _groups(shape: tuple[int, ...]) -> int:
    return shape[0] * shape[1]  # one group per (layer, key/value)


def encode_residual(
    target: torch.Tensor, recomputed: torch.Tensor, tolerance: float
) -> tuple[ResidualCode, torch.Tensor]:
    """Code ``target - recomputed``; return the code and the tensor the decoder will rebuild."""
    if target.shape != recomputed.shape:
        raise InvalidKVError(
            f"the KV cache has shape {tuple(target.shape)} but recomputing the tokens gives "
            f"{tuple(recomputed.shape)}: was it made from other tokens or another model?"
        )
    check_tolerance(tolerance)
    target = target.to(torch.float32).contiguous()
    if not torch.isfinite(target).all():
        raise InvalidKVError("the KV cache holds NaN or infinite values")
    mode = ResidualMode.BIT_EXACT if tolerance == 0 else ResidualMode.QUANTIZED
    recomputed = recomputed.to(torch.float32).contiguous()
    if torch.equal(target.view(torch.int32), recomputed.view(torch.int32)):
        # NOTE: the usual case (the caller's KV came from the schedule the decoder replays):
        # every symbol is 0, and the code is what _coded_residual gives for it (tested),
        # without its ten passes over the KV (a visible share of a portable encode).
        unchanged = (recomputed if mode is ResidualMode.BIT_EXACT else
                     _rebuild(recomputed, torch.zeros((), dtype=torch.int64), mode, tolerance))
        return _zero_code(tuple(target.shape), mode, tolerance), unchanged
    return _coded_residual(target, recomputed, mode, tolerance)


def _zero_code(shape: tuple[int, ...], mode: ResidualMode, tolerance: float) -> ResidualCode:
    """The code of a residual whose symbols are all 0: no words, no escapes."""
    words = constriction.stream.queue.RangeEncoder().get_compressed()
    return ResidualCode(mode=mode, tolerance=tolerance, shape=shape,
                        scales=(0.0,) * _groups(shape), words=words.astype("<u4").tobytes(),
                        escapes=b"")


def _coded_residual(target: torch.Tensor, recomputed: torch.Tensor, mode: ResidualMode,
                    tolerance: float) -> tuple[ResidualCode, torch.Tensor]:
    """``encode_residual`` of any residual (target float32, contiguous and finite)."""
    symbols, rebuilt = _symbols(target, recomputed, mode, tolerance)
    escaped = symbols.abs() >= ALPHABET_LIMIT
    if mode is ResidualMode.QUANTIZED:
        escaped |= (rebuilt - target).abs() > tolerance
    symbols = torch.where(escaped, torch.full_like(symbols, _ESCAPE), symbols)
    rebuilt = torch.where(escaped, target, rebuilt)
    escapes = target[escaped].view(torch.int32).numpy().astype("<i4").tobytes()

    grouped = symbols.reshape(_groups(tuple(target.shape)), -1).numpy()  # [L * 2, H * T * D]
    scales: list[float] = []
    encoder = constriction.stream.queue.RangeEncoder()
    for row in grouped:
        if not row.any():
            scales.append(0.0)
            continue
        inliers = row[row != _ESCAPE]
        scale = float(np.float32(max(np.abs(inliers).mean() if inliers.size else 0.0, MIN_SCALE)))
        scales.append(scale)
        encoder.encode(row.astype(np.int32), _laplace(scale))
    code = ResidualCode(
        mode=mode,
        tolerance=tolerance,
        shape=tuple(target.shape),
        scales=tuple(scales),
        words=encoder.get_compressed().astype("<u4").tobytes(),
        escapes=escapes,
    )
    return code, rebuilt


def decode_residual(code: ResidualCode, recomputed: torch.Tensor,
                    canonical: bool = False) -> torch.Tensor:
    """Rebuild the target from the recomputed tensor and the code; with ``canonical``, also
    refuse a code that ``encode_residual`` would not write for the symbols it decodes to
    (``_check_canonical``)."""
    if tuple(recomputed.shape) != code.shape:
        raise CorruptFileError(
            f"the file's KV residual has shape {code.shape}, the recomputed KV "
            f"{tuple(recomputed.shape)}"
        )
    groups = _groups(code.shape)
    if len(code.scales) != groups:
        raise CorruptFileError(f"the KV residual has {len(code.scales)} scales, expected {groups}")
    code.check()
    per_group = int(np.prod(code.shape)) // groups
    if len(code.escapes) // 4 > per_group * sum(1 for scale in code.scales if scale != 0.0):
        raise CorruptFileError("the KV residual stores more escapes than its used groups hold")
    recomputed = recomputed.to(torch.float32).contiguous()
    if not any(code.scales):
        # NOTE: the usual case (encode_residual's short way: the caller's KV is the one the
        # decoder replays): every symbol is 0 and nothing is escaped (checked above), so the
        # rebuild is the encoder's short way too, without the int64 symbol planes and their
        # stack (2 x 55 MB at 600 tokens of SmolLM2-135M, 2 x 754 MB at 8,185).
        if canonical and code.words != _zero_code(code.shape, code.mode, code.tolerance).words:
            raise CorruptFileError("the KV residual's code words are not the ones its encoder "
                                   "writes for its symbols (words appended or changed)")
        return (recomputed.clone() if code.mode is ResidualMode.BIT_EXACT else
                _rebuild(recomputed, torch.zeros((), dtype=torch.int64), code.mode,
                         code.tolerance))
    words = np.frombuffer(code.words, dtype="<u4").astype(np.uint32)
    rows = []
    # NOTE: constriction reports a malformed stream by panicking (a BaseException, not an
    # Exception); the checks above exclude what makes it panic, and anything else is caught.
    try:
        decoder = constriction.stream.queue.RangeDecoder(words)
        for scale in code.scales:
            if scale == 0.0:
                rows.append(np.zeros(per_group, dtype=np.int64))
            else:
                rows.append(decoder.decode(_laplace(scale), per_group).astype(np.int64))
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt | SystemExit | MemoryError):
            raise
        raise CorruptFileError(f"the KV residual's code does not decode: {error}") from None
    if canonical:
        _check_canonical(code, rows)
    symbols = torch.from_numpy(np.stack(rows)).reshape(code.shape)
    escaped = symbols == _ESCAPE
    escape_bits = np.frombuffer(code.escapes, dtype="<i4")
    if int(escaped.sum()) != escape_bits.shape[0]:
        raise CorruptFileError(
            f"the KV residual marks {int(escaped.sum())} escapes but stores "
            f"{escape_bits.shape[0]}"
        )
    symbols = torch.where(escaped, torch.zeros_like(symbols), symbols)
    rebuilt = _rebuild(recomputed, symbols, code.mode, code.tolerance)
    escape_values = torch.from_numpy(escape_bits.astype(np.int32)).view(torch.float32)
    rebuilt[escaped] = escape_values
    return rebuilt


def _check_canonical(code: ResidualCode, rows: list[np.ndarray]) -> None:
    """``CorruptFileError`` unless ``code`` is what ``_coded_residual`` writes for ``rows``: a
    group is used exactly when its symbols are not all 0, its scale is the one fitted to them,
    and the range coder's words are those of re-encoding them (no word appended, changed or
    left over when no group is used). Costs one encode of the used groups."""
    encoder = constriction.stream.queue.RangeEncoder()
    for scale, row in zip(code.scales, rows, strict=True):
        if scale == 0.0:
            continue
        inliers = row[row != _ESCAPE]
        fitted = float(np.float32(max(np.abs(inliers).mean() if inliers.size else 0.0,
                                      MIN_SCALE)))
        if not row.any() or fitted != scale:
            raise CorruptFileError("the KV residual marks a group used with a scale its "
                                   "encoder would not write for its symbols")
        encoder.encode(row.astype(np.int32), _laplace(scale))
    if encoder.get_compressed().astype("<u4").tobytes() != code.words:
        raise CorruptFileError("the KV residual's code words are not the ones its encoder "
                               "writes for its symbols (words appended or changed)")


def check_tolerance(tolerance: float) -> float:
    """``tolerance`` if it is exactly 0 or a normal number in ``[MIN_TOLERANCE, MAX_TOLERANCE]``
    (``residual_code.is_tolerance``), else InvalidToleranceError."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not (
            is_tolerance(float(tolerance))):
        raise InvalidToleranceError(
            f"the tolerance must be 0 (bit-exact) or a normal number in [{MIN_TOLERANCE:g}, "
            f"{MAX_TOLERANCE:g}], not {tolerance!r}")
    return float(tolerance)


def _laplace(scale: float) -> constriction.stream.model.QuantizedLaplace:
    return constriction.stream.model.QuantizedLaplace(
        -ALPHABET_LIMIT, ALPHABET_LIMIT, mean=0.0, scale=scale
    )


def _symbols(
    target: torch.Tensor, recomputed: torch.Tensor, mode: ResidualMode, tolerance: float
) -> tuple[torch.Tensor, torch.Tensor]:
    recomputed = recomputed.to(torch.float32).contiguous()
    if mode is ResidualMode.BIT_EXACT:
        symbols = _ordered(target) - _ordered(recomputed)
    else:
        step = 2.0 * tolerance
        ratio = ((target.double() - recomputed.double()) / step).round()
        symbols = ratio.clamp(-ALPHABET_LIMIT, ALPHABET_LIMIT).to(torch.int64)
    clipped = symbols.clamp(-ALPHABET_LIMIT, ALPHABET_LIMIT)
    return symbols, _rebuild(recomputed, clipped, mode, tolerance)


def _rebuild(
    recomputed: torch.Tensor, symbols: torch.Tensor, mode: ResidualMode, tolerance: float
) -> torch.Tensor:
    if mode is ResidualMode.BIT_EXACT:
        return _from_ordered(_ordered(recomputed) + symbols)
    step = torch.tensor(2.0 * tolerance, dtype=torch.float32)
    return recomputed + symbols.to(torch.float32) * step


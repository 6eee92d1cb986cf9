"""Predictive delta coding of a KV cache (layer 2 of arXiv 2604.15356), composed with the
per-vector quantizers.

Motivation: the paper stores each token position's KV as a prediction the decoder can rebuild
plus a quantized residual, with the residual's bits allocated by surprisal. This module is the
sequential encoder and decoder for that scheme with any predictor of ``seqkv.delta.predictors``
and any quantizer of ``seqkv.quantizers``, and counts every stored bit.

Encode, for ``i = 0 .. T-1`` (``seqkv.delta.closed_loop``, one step per position):
``pred_i = predictor(decoded_<i)``; ``r_i = KV_i - pred_i``; quantize ``r_i`` at width ``b_i``;
``decoded_i = pred_i + dequantize(codes_i)``. The codes of all positions are then entropy-coded
(``seqkv.delta.residual_coder``). Decode runs the same loop with the stored codes. Predictors
that need the tokens (top-k, exact) get them from a token code made by seqkv's token codec
(``seqkv.codec.encode`` without KV: a ``CodedSession``, no file), kept with the delta code.

What is stored and counted (``DeltaCode.num_bits``): the range-coded codes, the fitted tables
and their flags, the quantizer's side information (norms, scales, zero-points, QJL signs) at
its stored size, 3 bits per position for the widths, and the token code's bits when the
predictor needs the tokens. Not counted: a fixed header (predictor, quantizer, seed, shape,
model identity), as ``seqkv.skv`` reports its container apart.

Invariants:
1. ``decode_delta(model, encode_delta(...).code).kv`` equals the encoder's ``decoded`` bit for
   bit on the same machine and schedule (enforced: both run ``seqkv.delta.closed_loop`` on the
   same inputs inside ``pinned_threads``; checked by ``tests/test_delta_codec.py`` for every
   predictor and quantizer).
2. ``KV - decoded == r - dequantize(quantize(r))`` up to one float32 rounding: closed-loop
   prediction means quantization error never accumulates (checked by the same tests, with each
   quantizer's error bound).
3. The encoder never reads a quantity the decoder cannot rebuild: predictions come from the
   session protocol (``predictors/base.py``), widths are stored (enforced).
4. Input KV is ``[layers, 2, kv_heads, T, head_dim]`` for the model's geometry and ``T`` tokens,
   finite (enforced: InvalidKVError).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from seqkv.bounds import raise_unless_all_hold
from seqkv.codec import (
    DecodeItem,
    DecodeLimits,
    check_decodable,
    decode_prepared_tokens,
    encode,
    prepare_decode,
)
from seqkv.delta.bit_allocation import AllocationMode, allocate_bits, width_bits
from seqkv.delta.closed_loop import decode_loop, encode_loop
from seqkv.delta.predictors.base import ForwardCost, Predictor, PredictorContext
from seqkv.delta.residual_coder import (
    FIXED_WIDTHS,
    ResidualQuantizerBank,
    SymbolCode,
    decode_symbols,
    encode_symbols,
    join_codes,
    split_codes,
    supported_bits,
)
from seqkv.errors import CorruptCodeError, DeltaConfigError, InvalidKVError, InvalidTokensError
from seqkv.kvcache import tensor_from_cache
from seqkv.models.adapter import CausalLM
from seqkv.quantizers import QuantizedTensor, QuantizerName
from seqkv.schedule import pinned_threads
from seqkv.session import CodedSession


@dataclass(frozen=True)
class DeltaConfig:
    """One delta-coding method: predictor, quantizer, budget ``b0`` and allocation mode.

    >>> from seqkv.delta.predictors import NoPrediction
    >>> DeltaConfig(NoPrediction(), "turboquant_mse", 3).label
    'none + turboquant_mse-3 (uniform)'
    """

    predictor: Predictor
    quantizer: QuantizerName = "turboquant_mse"
    budget_bits: int = 3
    allocation: AllocationMode = AllocationMode.UNIFORM
    seed: int = 0
    """TurboQuant's rotation seed (the decoder must use the same)."""

    def __post_init__(self) -> None:
        allowed = supported_bits(self.quantizer)
        if self.budget_bits not in allowed:
            raise DeltaConfigError(
                f"quantizer {self.quantizer!r} supports budgets {allowed}, got {self.budget_bits}"
            )
        if self.quantizer in FIXED_WIDTHS and self.allocation is not AllocationMode.UNIFORM:
            raise DeltaConfigError(
                f"quantizer {self.quantizer!r} has one width only; use AllocationMode.UNIFORM"
            )

    @property
    def label(self) -> str:
        return (f"{self.predictor.label} + {self.quantizer}-{self.budget_bits} "
                f"({self.allocation.value})")


@dataclass(frozen=True)
class TokenStore:
    """The tokens as seqkv's token codec codes them: a coded session without KV (a value, not
    ``.skv`` bytes; the delta code holds no file)."""

    session: CodedSession
    code_bits: int
    """The arithmetic code's exact length: what the delta code counts for the tokens."""
    num_tokens: int
    cost: ForwardCost
    seconds: float


def store_tokens(model: CausalLM, tokens: Sequence[int]) -> TokenStore:
    """Code ``tokens`` with ``seqkv.codec.encode`` at its default level, without KV (one
    forward per token, plus the start token); a failed bound of the codec raises."""
    token_list = [int(t) for t in tokens]
    encoded = encode(model, token_list)
    raise_unless_all_hold(encoded.bounds)
    calls = len(token_list) + (model.start_token_id is not None)
    return TokenStore(encoded.session, encoded.session.token_code.num_bits, len(token_list),
                      ForwardCost(calls, calls), encoded.encode_seconds)


@dataclass(frozen=True)
class SurprisalProfile:
    """``-log2 P(t_i | t_<i)`` per token from one forward, and what that forward cost."""

    bits: npt.NDArray[np.float64]
    cost: ForwardCost
    seconds: float


@torch.inference_mode()
def surprisal_bits(model: CausalLM, tokens: Sequence[int]) -> SurprisalProfile:
    """Per-token surprisal from one forward over ``[start] + tokens`` (the first token under the
    start token, or uniform if the model has none)."""
    token_list = [int(t) for t in tokens]
    model.check_tokens(token_list)
    started = time.perf_counter()
    start = model.start_token_id
    inputs = token_list if start is None else [start, *token_list]
    ids = torch.tensor([inputs], dtype=torch.long, device=model.device)  # [1, T(+1)]
    logits = model.model(input_ids=ids).logits[0].double().cpu()  # [T(+1), V]
    log2p = torch.log_softmax(logits, dim=-1) / np.log(2.0)
    targets = torch.tensor(token_list)
    if start is None:
        rest = -log2p[:-1].gather(1, targets[1:, None]).squeeze(1)  # [T - 1]
        bits = torch.cat([torch.tensor([np.log2(model.vocab_size)]), rest])
    else:
        bits = -log2p[:-1].gather(1, targets[:, None]).squeeze(1)  # [T]
    cost = ForwardCost(1, len(inputs))
    return SurprisalProfile(bits.numpy(), cost, time.perf_counter() - started)


@dataclass(frozen=True)
class BitBreakdown:
    """Stored bits of a delta code, by part (totals over all positions)."""

    payload: int
    """Range-coded quantizer codes."""
    tables: int
    """Fitted categoricals and their flags."""
    side: int
    """Quantizer side information (norms, scales, zero-points, QJL signs)."""
    widths: int
    """Per-position widths."""
    tokens: int
    """Token code, when the predictor needs the tokens."""

    @property
    def total(self) -> int:
        return self.payload + self.tables + self.side + self.widths + self.tokens


@dataclass(frozen=True)
class DeltaCode:
    """Everything the decoder reads (a header with the config and shape aside)."""

    config: DeltaConfig
    shape: tuple[int, int, int, int, int]
    """``[layers, 2, kv_heads, T, head_dim]``."""
    widths: tuple[int, ...]
    sides: tuple[QuantizedTensor, ...]
    """Per position: the quantizer's output without its main code stream."""
    symbols: SymbolCode
    tokens: TokenStore | None
    packed_code_bits: int
    """The main code streams at their packed size (what the quantizer alone would store)."""

    @property
    def num_tokens(self) -> int:
        return self.shape[3]

    @property
    def breakdown(self) -> BitBreakdown:
        return BitBreakdown(
            payload=self.symbols.payload_bits,
            tables=self.symbols.table_bits,
            side=sum(s.num_bits for s in self.sides),
            widths=width_bits(self.num_tokens),
            tokens=0 if self.tokens is None else self.tokens.code_bits,
        )

    @property
    def num_bits(self) -> int:
        return self.breakdown.total

    @property
    def bits_per_token(self) -> float:
        """All stored bits per token position (all layers and heads, K and V)."""
        return self.num_bits / self.num_tokens


@dataclass(frozen=True)
class DeltaEncodeResult:
    code: DeltaCode
    decoded: torch.Tensor
    """What the decoder will rebuild, ``[layers, 2, kv_heads, T, head_dim]``."""
    prediction: torch.Tensor
    residual: torch.Tensor
    """``KV - prediction``, the quantizer's input, same shape."""
    residual_energy: float
    """``||residual||^2 / ||KV||^2``: how much of the KV the prediction leaves to code."""
    cost: ForwardCost
    """Every forward the encoder ran, the token codec's and the surprisal forward included."""
    seconds: float
    """Wall time of encoding, the token codec's and surprisal forward's recorded time included."""


@dataclass(frozen=True)
class DeltaDecodeResult:
    kv: torch.Tensor
    """``[layers, 2, kv_heads, T, head_dim]`` float32."""
    tokens: list[int] | None
    cost: ForwardCost
    """Forwards of the predictor (and of token decoding, when the tokens were decoded here)."""
    seconds: float


class _BankSteps:
    """The closed loop's quantizer of a position-by-position code: position ``p``'s residual at
    its width ``widths[p]``."""

    def __init__(self, bank: ResidualQuantizerBank, widths: Sequence[int]) -> None:
        self.bank = bank
        self.widths = widths

    def quantize(self, step: int, residual: torch.Tensor) -> QuantizedTensor:
        return self.bank.quantize(residual, self.widths[step])

    def dequantize(self, step: int, code: QuantizedTensor) -> torch.Tensor:
        return self.bank.dequantize(code, self.widths[step])


def _as_tensor(kv: DynamicCache | torch.Tensor) -> torch.Tensor:
    tensor = tensor_from_cache(kv) if isinstance(kv, DynamicCache) else kv
    return tensor.detach().to("cpu", torch.float32)


def _check_kv(model: CausalLM, kv: torch.Tensor, num_tokens: int) -> None:
    expected = (model.num_layers, 2, model.kv_heads, num_tokens, model.head_dim)
    if tuple(kv.shape) != expected:
        raise InvalidKVError(
            f"the KV cache has shape {tuple(kv.shape)}; {num_tokens} tokens of model "
            f"{model.name!r} need [layers, 2, kv_heads, tokens, head_dim] = {expected}"
        )
    if not bool(torch.isfinite(kv).all()):
        raise InvalidKVError("the KV cache holds NaN or infinite values")


def encode_delta(
    model: CausalLM,
    tokens: Sequence[int],
    kv: DynamicCache | torch.Tensor,
    config: DeltaConfig,
    *,
    surprisal: SurprisalProfile | None = None,
    token_store: TokenStore | None = None,
) -> DeltaEncodeResult:
    """Delta-code ``kv`` (the cache ``tokens`` produced) with ``config``.

    ``surprisal`` and ``token_store`` may be passed to share them between encodes; their recorded
    cost is still counted in the result.

    >>> from seqkv.models import tiny_random_llama
    >>> from seqkv.delta.predictors import PreviousToken
    >>> model = tiny_random_llama()
    >>> tokens = [5, 17, 17, 3, 9, 44]
    >>> kv = model.prefill(tokens)
    >>> encoded = encode_delta(model, tokens, kv, DeltaConfig(PreviousToken(), "int8", 8))
    >>> decoded = decode_delta(model, encoded.code)
    >>> torch.equal(decoded.kv, encoded.decoded)
    True
    """
    token_list = [int(t) for t in tokens]
    model.check_tokens(token_list)
    target = _as_tensor(kv)
    num_tokens = len(token_list)
    _check_kv(model, target, num_tokens)
    started = time.perf_counter()
    cost = ForwardCost()
    extra_seconds = 0.0
    if config.allocation is not AllocationMode.UNIFORM:
        if surprisal is None:
            surprisal = surprisal_bits(model, token_list)
        elif surprisal.bits.shape != (num_tokens,):
            raise DeltaConfigError(
                f"surprisal has shape {surprisal.bits.shape}, not ({num_tokens},)"
            )
        cost += surprisal.cost
        extra_seconds += surprisal.seconds
    widths = allocate_bits(config.allocation, config.budget_bits, num_tokens,
                           None if surprisal is None else surprisal.bits)
    stored_tokens = None
    if config.predictor.needs_tokens:
        if token_store is None:
            token_store = store_tokens(model, token_list)
        elif token_store.num_tokens != num_tokens:
            raise InvalidTokensError(
                f"the token store holds {token_store.num_tokens} tokens, the KV {num_tokens}"
            )
        stored_tokens = token_store
        cost += token_store.cost
        extra_seconds += token_store.seconds

    bank = ResidualQuantizerBank(config.quantizer, model.head_dim, config.seed)
    decoded = torch.empty_like(target)  # [L, 2, H, T, D]
    prediction = torch.empty_like(target)
    sides: list[QuantizedTensor] = []
    codes: list[torch.Tensor | None] = []
    code_bits: list[int | None] = []
    packed = 0
    context = PredictorContext(
        model, tuple(token_list) if config.predictor.needs_tokens else None, num_tokens
    )
    step_widths = [int(w) for w in widths]
    with pinned_threads():
        session = config.predictor.start(context)
        for step in encode_loop(num_tokens, lambda position: target[:, :, :, position, :],
                                session, _BankSteps(bank, step_widths)):  # each [L, 2, H, D]
            q = step.code
            prediction[:, :, :, step.step, :] = step.prediction
            decoded[:, :, :, step.step, :] = step.decoded
            stripped, stream = split_codes(q)
            sides.append(stripped)
            codes.append(stream)
            code_bits.append(bank.code_bits(step_widths[step.step]))
            packed += 0 if q.codes is None else q.codes.num_bits
        cost += session.cost
    symbols = encode_symbols(codes, code_bits)
    residual = target - prediction
    energy = float(residual.double().square().sum() / target.double().square().sum().clamp_min(
        1e-300))
    code = DeltaCode(
        config=config,
        shape=(model.num_layers, 2, model.kv_heads, num_tokens, model.head_dim),
        widths=tuple(int(w) for w in widths),
        sides=tuple(sides),
        symbols=symbols,
        tokens=stored_tokens,
        packed_code_bits=packed,
    )
    seconds = time.perf_counter() - started + extra_seconds
    return DeltaEncodeResult(code, decoded, prediction, residual, energy, cost, seconds)


def decode_delta(
    model: CausalLM, code: DeltaCode, tokens: Sequence[int] | None = None
) -> DeltaDecodeResult:
    """Rebuild the KV from ``code``. Predictors that need the tokens decode them from the
    stored token code, unless ``tokens`` (already decoded elsewhere) are passed."""
    started = time.perf_counter()
    layers, _, heads, num_tokens, head_dim = code.shape
    if (layers, heads, head_dim) != (model.num_layers, model.kv_heads, model.head_dim):
        raise InvalidKVError(
            f"the delta code holds KV of shape {code.shape}, which model {model.name!r} "
            "cannot have produced: decode with the model that coded it"
        )
    if len(code.widths) != num_tokens or len(code.sides) != num_tokens:
        raise CorruptCodeError(
            "the delta code's widths or side information do not match its shape: it was "
            "damaged; encode the KV again"
        )
    cost = ForwardCost()
    token_list: list[int] | None = None
    predictor = code.config.predictor
    if predictor.needs_tokens:
        if tokens is not None:
            token_list = [int(t) for t in tokens]
        elif code.tokens is not None:
            # the tokens only: the model's checks as a decode, no KV prefill (the delta code
            # rebuilds the KV itself)
            coded = code.tokens.session
            token_list = decode_prepared_tokens(model, prepare_decode(
                model, DecodeItem(coded), DecodeLimits(),
                kv_checkable=check_decodable(model, coded, False), with_kv=False))
            cost += code.tokens.cost
        else:
            raise InvalidTokensError(
                "the delta code stores no tokens, and none were passed: pass tokens= (the "
                "sequence the code was made from)"
            )
        if len(token_list) != num_tokens:
            raise InvalidTokensError(f"got {len(token_list)} tokens for {num_tokens} positions")
    bank = ResidualQuantizerBank(code.config.quantizer, head_dim, code.config.seed)
    code_bits = [bank.code_bits(w) for w in code.widths]
    streams = decode_symbols(code.symbols, code_bits, (layers, 2, heads, 1, head_dim))
    kv = torch.empty(code.shape)  # [L, 2, H, T, D]
    context = PredictorContext(
        model, None if token_list is None else tuple(token_list), num_tokens
    )
    with pinned_threads():
        session = predictor.start(context)
        stored = decode_loop(
            num_tokens,
            lambda position: join_codes(code.sides[position], streams[position],
                                        code_bits[position]),
            session, _BankSteps(bank, code.widths))
        for position, value in enumerate(stored):
            kv[:, :, :, position, :] = value  # [L, 2, H, D]
        cost += session.cost
    return DeltaDecodeResult(kv, token_list, cost, time.perf_counter() - started)

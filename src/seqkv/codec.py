"""The lossless sequential KV codec: tokens coded under the model, plus a coded KV residual.

A KV cache is a deterministic function of its tokens under a fixed computation schedule, so it is
stored as (1) the tokens, arithmetic-coded under the model's own next-token distribution, and
(2) when the caller passes the KV a run produced, the residual between it and the decoder's
recomputation, quantized at a stated tolerance and entropy-coded (``seqkv.coding.residual``).
This is layer 2 of arXiv 2604.15356 with the exact recompute as the predictor.

Invariants:
1. The encoder computes every probability along the decoder's schedule: one forward per token on
   a growing cache, float32, one intra-op thread (``seqkv.schedule``). The first token is coded
   under the model's distribution after its start token (BOS), or uniformly if it has none
   (enforced).
2. ``decompress`` returns tokens and KV only after both match the SHA-256 checksums the encoder
   stored; otherwise it raises DecodeVerificationError (enforced).
3. A file coded with another model, or under a profile the decoder cannot reproduce, is refused
   before any decoding (enforced; see ``ExecutionProfile``).
4. The token code is at most the model's cross-entropy on the same tokens (the same
   probabilities) plus 2 bits plus 1.7e-5 bits per token (checked by the tests).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from seqkv.bounds import (
    Bound,
    code_within_reference_cross_entropy,
    code_within_table_cost,
    code_within_uniform,
    file_bytes_accounted,
    raise_unless_all_hold,
    reference_surprisal,
    residual_within_tolerance,
)
from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder
from seqkv.coding.residual import ResidualCode, decode_residual, encode_residual
from seqkv.container import (
    FORMAT_VERSION,
    Container,
    Header,
    KVSection,
    PrefixSection,
    ResidualSection,
    TokenSection,
    decode_container,
    encode_container_with_sections,
)
from seqkv.errors import (
    CorruptFileError,
    DecodeVerificationError,
    EnvironmentMismatchError,
    InvalidKVError,
    InvalidLevelError,
    InvalidTokensError,
    ModelMismatchError,
    PrefixMismatchError,
    PrefixUnavailableError,
    UnsupportedVersionError,
)
from seqkv.kvcache import cache_from_tensor, tensor_from_cache
from seqkv.levels import (
    DEFAULT_LEVEL,
    CodingLevel,
    DecodeOutput,
    DecodeRequest,
    EncodeRequest,
    TraceColumns,
    family,
    parse_level,
)
from seqkv.levels.segments import MAX_SEGMENTS, SegmentsLevel
from seqkv.models.adapter import CausalLM
from seqkv.trie.keys import PrefixHash
from seqkv.trie.radix import ResolvedPrefix
from seqkv.types import Schedule
from seqkv.version import __version__

# NOTE: 1e-4 is below fp16's resolution for any KV component above 0.2 in magnitude, and above
# the ~3e-5 by which one prefill and token-by-token recomputation differ on SmolLM2-135M (CPU),
# so on that model the residual usually costs only its per-group scales. 0 means bit-exact.
DEFAULT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class CodingTrace:
    """Per-position figures along the coded tokens, for the checker (``seqkv.checker``).

    ``surprisal_bits[i]`` is ``-log2 P(t_i | t_<i)`` under the float probabilities (the first
    token under its start context); ``code_cost_bits[i]`` the same under the integer frequency
    table the coder used; ``entropy_bits[i]`` the entropy of the distribution, the model's own
    uncertainty at position i.
    """

    surprisal_bits: npt.NDArray[np.float64]
    code_cost_bits: npt.NDArray[np.float64]
    entropy_bits: npt.NDArray[np.float64]


def _trace(columns: TraceColumns) -> CodingTrace:
    return CodingTrace(np.array(columns.surprisal), np.array(columns.cost),
                       np.array(columns.entropy))


@dataclass(frozen=True)
class CompressStats:
    """Measured figures of one compression; bits are exact counts, not estimates."""

    tokens: int  # coded positions (after the shared prefix, if any)
    prefix_tokens: int
    code_bits: int
    ideal_code_bits: float
    cross_entropy_bits: float
    residual_bits: int
    residual_escapes: int
    file_bytes: int
    kv_components_per_token: int
    encode_seconds: float
    max_abs_kv_error: float | None
    # Model forwards the encoder ran (a cached start row counts as one): deterministic per level.
    forwards: int = 0

    @property
    def bits_per_token(self) -> float:
        return self.code_bits / self.tokens

    @property
    def cross_entropy_bits_per_token(self) -> float:
        return self.cross_entropy_bits / self.tokens

    @property
    def total_bits_per_token(self) -> float:
        """Token code plus residual code per token position (container overhead excluded)."""
        return (self.code_bits + self.residual_bits) / self.tokens

    @property
    def fp16_bits_per_token(self) -> int:
        return 16 * self.kv_components_per_token

    @property
    def ratio_vs_fp16(self) -> float:
        return self.fp16_bits_per_token / self.total_bits_per_token


@dataclass(frozen=True)
class CompressResult:
    data: bytes
    header: Header
    stats: CompressStats
    trace: CodingTrace
    bounds: tuple[Bound, ...]  # all hold unless compress was told to return violations
    sections: dict[str, int]  # the file's bytes, section by section


@dataclass(frozen=True)
class DecompressStats:
    """What the decoder measured; nothing here is read from the file's header.

    ``verified`` is the conjunction of the two checksum comparisons the decoder made (a failed
    one raises, so a returned result has it true). The decoder cannot measure the error against
    the caller's original KV, which it never saw: ``max_abs_residual`` is how far the stored
    residual moved the recomputed KV, and the file's tolerance is the encoder's promise, kept
    by construction and checked by the encoder's ``residual_within_tolerance`` bound.
    """

    tokens: int
    decode_seconds: float
    max_abs_residual: float  # max |decoded KV - recomputed KV|
    tokens_verified: bool
    kv_verified: bool
    # Model forwards the decode ran; files decoded together share theirs (each reports the total).
    forwards: int = 0

    @property
    def verified(self) -> bool:
        return self.tokens_verified and self.kv_verified


@dataclass(frozen=True)
class DecompressResult:
    tokens: list[int]
    cache: DynamicCache
    kv: torch.Tensor  # [layers, 2, kv_heads, tokens, head_dim], float32
    header: Header
    stats: DecompressStats
    trace: CodingTrace


def _sha256(array: npt.NDArray[np.generic] | torch.Tensor) -> str:
    data = array.contiguous().numpy() if isinstance(array, torch.Tensor) else array
    return hashlib.sha256(np.ascontiguousarray(data).data).hexdigest()


def _tokens_sha256(tokens: Sequence[int]) -> str:
    return _sha256(np.asarray(tokens, dtype="<i4"))


class PrefixSource(Protocol):
    """Where a decoder finds shared prefixes by hash: a ``seqkv.trie.PrefixTrie``."""

    def resolve(self, prefix_hash: PrefixHash, *, with_kv: bool = True) -> ResolvedPrefix: ...


def _check_prefix(model: CausalLM, tokens: list[int], prefix: ResolvedPrefix) -> None:
    length = len(prefix.tokens)
    if not 1 <= length < len(tokens) or list(prefix.tokens) != tokens[:length]:
        raise InvalidTokensError(
            f"the shared prefix ({length} tokens) must be a proper prefix of the "
            f"{len(tokens)} tokens to compress"
        )
    expected = (model.num_layers, 2, model.kv_heads, length, model.head_dim)
    if prefix.kv is None or tuple(prefix.kv.shape) != expected:
        raise InvalidKVError(
            f"the shared prefix must hold its KV of shape {list(expected)}: resolve it from a "
            "trie whose session was inserted with its KV"
        )


def compress(
    model: CausalLM,
    tokens: Sequence[int],
    kv: DynamicCache | torch.Tensor | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    progress: bool = False,
    prefix: ResolvedPrefix | None = None,
    level: CodingLevel | str = DEFAULT_LEVEL,
    *,
    on_violation: Literal["raise", "return"] = "raise",
) -> CompressResult:
    """Code ``tokens`` (and the residual of ``kv``, a cache those tokens produced) into .skv bytes.

    With ``prefix`` (a shared prefix resolved from a ``seqkv.trie.PrefixTrie``), the file
    references it by hash and codes only the tokens after it; ``kv`` still covers all tokens.
    ``level`` sets the rate-compute dial (``seqkv.levels``): ``tokens`` (default), ``rows``,
    ``segments:N``, ``ngram`` or ``plain``, or a ``CodingLevel``.

    Every run evaluates the bounds of ``seqkv.bounds`` on what it coded and raises
    ``BoundViolationError`` when one fails; ``on_violation="return"`` returns the result with its
    failed bounds instead (``seqkv check`` reports them).

    >>> from seqkv.models import tiny_random_llama
    >>> model = tiny_random_llama()
    >>> result = compress(model, [5, 17, 17, 3])
    >>> decompress(model, result.data).tokens
    [5, 17, 17, 3]
    """
    token_list = [int(t) for t in tokens]
    model.check_tokens(token_list)
    if prefix is not None:
        _check_prefix(model, token_list, prefix)
    tail = token_list[len(prefix.tokens) if prefix is not None else 0 :]
    target = None
    if kv is not None:
        target = (tensor_from_cache(kv) if isinstance(kv, DynamicCache) else kv).detach()
        target = target.to("cpu", torch.float32)
    coding_level = parse_level(level) if isinstance(level, str) else level
    context = model.start_token_id
    started = time.perf_counter()
    encoder = ArithmeticEncoder()
    encoded = coding_level.encode(EncodeRequest(model, tail, prefix, context, encoder, progress))
    token_code = encoder.finish()
    residual = None
    residual_section = None
    rebuilt = encoded.kv
    max_error = None
    if target is not None:
        residual, rebuilt = encode_residual(target, encoded.kv, tolerance)
        max_error = float((rebuilt - target).abs().max())
        residual_section = ResidualSection(
            mode=residual.mode.value,
            tolerance=tolerance,
            scales=list(residual.scales),
            num_escapes=residual.num_escapes,
            max_abs_error=max_error,
        )
    encode_seconds = time.perf_counter() - started
    header = Header(
        format_version=FORMAT_VERSION,
        writer=f"seqkv {__version__}",
        model=model.identity,
        profile=model.profile(coding_level.spec.schedule),
        prefix=None if prefix is None else PrefixSection(
            prefix_hash=str(prefix.prefix_hash),
            tokens=len(prefix.tokens),
            kv_sha256=_sha256(prefix.kv.to(torch.float32)) if prefix.kv is not None else "",
        ),
        tokens=TokenSection(
            count=len(tail),
            num_bits=token_code.num_bits,
            first_token_context=context,
            sha256=_tokens_sha256(token_list),
            level=family(coding_level),
            segments=encoded.segments,
            vocab_size=model.vocab_size,
        ),
        kv=KVSection(
            shape=list(rebuilt.shape),
            dtype="float32",
            sha256=_sha256(rebuilt),
            residual=residual_section,
        ),
    )
    data, sections = encode_container_with_sections(Container(header, token_code, residual))
    trace = _trace(encoded.trace)
    bounds = _bounds(model, coding_level, tail, encoded.segments, context, prefix,
                     token_code.num_bits, trace, residual, max_error, tolerance, len(data),
                     sections)
    if on_violation == "raise":
        raise_unless_all_hold(bounds)
    stats = CompressStats(
        tokens=len(tail),
        prefix_tokens=len(token_list) - len(tail),
        code_bits=token_code.num_bits,
        ideal_code_bits=float(trace.code_cost_bits.sum()),
        cross_entropy_bits=float(trace.surprisal_bits.sum()),
        residual_bits=residual.num_bits if residual is not None else 0,
        residual_escapes=residual.num_escapes if residual is not None else 0,
        file_bytes=len(data),
        kv_components_per_token=model.kv_components_per_token,
        encode_seconds=encode_seconds,
        max_abs_kv_error=max_error,
        forwards=encoded.forwards,
    )
    return CompressResult(data, header, stats, trace, bounds, sections)


def _bounds(model: CausalLM, level: CodingLevel, tail: list[int], lengths: list[int],
            context: int | None, prefix: ResolvedPrefix | None, code_bits: int,
            trace: CodingTrace, residual: ResidualCode | None, max_error: float | None,
            tolerance: float, file_bytes: int, sections: dict[str, int]) -> tuple[Bound, ...]:
    """The cheap bounds of ``seqkv.bounds`` on what ``compress`` has just coded."""
    bounds = [code_within_table_cost(code_bits, float(trace.code_cost_bits.sum()))]
    if level.spec.reference == "model":
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
        segments = [tail[offsets[j] : offsets[j + 1]] for j in range(len(lengths))]
        reference = reference_surprisal(model, segments, context,
                                        prefix.tokens if prefix is not None else ())
        bounds.append(code_within_reference_cross_entropy(
            code_bits, float(reference.sum()), len(tail), model.vocab_size))
    elif level.spec.reference == "uniform":
        bounds.append(code_within_uniform(code_bits, len(tail), model.vocab_size))
    if residual is not None and max_error is not None:
        bounds.append(residual_within_tolerance(max_error, tolerance, residual.num_bits,
                                                residual.num_escapes))
    bounds.append(file_bytes_accounted(file_bytes, sections))
    return tuple(bounds)


def level_of(header: Header) -> CodingLevel:
    """The coding level a file records, or UnsupportedVersionError for one unknown here."""
    name = header.tokens.level
    if name == "segments":
        # A version-2 file records the segment lengths; the count is how many it has.
        return SegmentsLevel(max(2, min(len(header.tokens.segments or []), MAX_SEGMENTS)))
    try:
        return parse_level(name)
    except InvalidLevelError:
        raise UnsupportedVersionError(
            f"the file was coded at level {name!r}, which this seqkv does not know: use the "
            "seqkv release that wrote it"
        ) from None


def check_decodable(model: CausalLM, header: Header, allow_environment_mismatch: bool) -> None:
    """Raise unless ``model`` on this machine can reproduce the file's probabilities and KV."""
    if not header.model.same_model(model.identity):
        raise ModelMismatchError(
            f"the file was coded with model {header.model.name!r} (weights "
            f"{header.model.weights_sha256[:12]}), not with {model.name!r} (weights "
            f"{model.identity.weights_sha256[:12]}): decode it with the model that coded it"
        )
    schedule = header.profile.schedule
    if schedule not in get_args(Schedule):
        raise EnvironmentMismatchError(f"the file's schedule {schedule!r} is unknown here")
    profile = model.profile(schedule)
    portable = "" if level_of(header).spec.model_coded else (
        "; its tokens are portable: seqkv.decompress_tokens (CLI: --tokens-only) decodes them "
        "on any machine")
    hard = header.profile.hard_mismatches(profile)
    if hard:
        raise EnvironmentMismatchError(
            "this machine cannot reproduce the encoder's probabilities and KV: "
            + "; ".join(hard) + portable
        )
    soft = header.profile.soft_mismatches(profile)
    if soft and not allow_environment_mismatch:
        raise EnvironmentMismatchError(
            "the file was coded under another environment (" + "; ".join(soft) + "); exact "
            "decoding is unlikely. Pass allow_environment_mismatch=True (CLI: "
            "--allow-environment-mismatch) to try anyway: the checksums still catch any error"
            + portable
        )


def _resolve_prefix(header: Header, prefixes: PrefixSource | None,
                    with_kv: bool = True) -> ResolvedPrefix | None:
    """The file's shared prefix from ``prefixes``; without ``with_kv`` its tokens only (the
    tokens checksum then vouches for them)."""
    section = header.prefix
    if section is None:
        return None
    if prefixes is None:
        raise PrefixUnavailableError(
            f"the file codes only the tokens after a shared prefix of {section.tokens} tokens "
            f"(hash {section.prefix_hash[:16]}): pass the PrefixTrie that holds it"
        )
    prefix = prefixes.resolve(PrefixHash(section.prefix_hash), with_kv=with_kv)
    kv_differs = with_kv and (prefix.kv is None
                              or _sha256(prefix.kv.to(torch.float32)) != section.kv_sha256)
    if len(prefix.tokens) != section.tokens or kv_differs:
        raise PrefixMismatchError(
            f"the trie's prefix {section.prefix_hash[:16]} is not the one the file was coded "
            "against: its tokens or KV differ"
        )
    return prefix


@dataclass
class _Pending:
    """A file between parsing and verification."""

    container: Container
    level: CodingLevel
    prefix: ResolvedPrefix | None
    started: float
    output: DecodeOutput | None = None

    def request(self, with_kv: bool, progress: bool = False) -> DecodeRequest:
        tokens = self.container.header.tokens
        lengths = tokens.segments or [tokens.count]
        if sum(lengths) != tokens.count or min(lengths) < 1:
            raise CorruptFileError("the file's segment lengths are not positive or do not add "
                                   "up to its token count")
        if tokens.vocab_size is None and not self.level.spec.model_coded:
            raise CorruptFileError("the file's model-free level does not record the vocabulary "
                                   "size")
        return DecodeRequest(ArithmeticDecoder(self.container.token_code), tokens.count,
                             list(lengths), tokens.first_token_context, tokens.vocab_size or 0,
                             self.prefix, with_kv, progress)


def _begin(model: CausalLM, data: bytes, allow_environment_mismatch: bool,
           prefixes: PrefixSource | None) -> _Pending:
    container = decode_container(data)
    check_decodable(model, container.header, allow_environment_mismatch)
    prefix = _resolve_prefix(container.header, prefixes)
    return _Pending(container, level_of(container.header), prefix, time.perf_counter())


def _decode(model: CausalLM | None, pendings: Sequence[_Pending], with_kv: bool,
            progress: bool = False) -> None:
    """Decode every pending file at its level; files whose levels share a batch group decode
    in one call, sharing its forwards."""
    groups: dict[object, list[_Pending]] = {}
    for index, pending in enumerate(pendings):
        key = pending.level.spec.batch_group or ("alone", index)
        groups.setdefault(key, []).append(pending)
    for group in groups.values():
        outputs = group[0].level.decode(model, [p.request(with_kv, progress) for p in group])
        for pending, output in zip(group, outputs, strict=True):
            pending.output = output


def _finish(model: CausalLM, pending: _Pending) -> DecompressResult:
    """Verify the tokens, rebuild and verify the KV."""
    header = pending.container.header
    prefix = pending.prefix
    output = pending.output
    assert output is not None and output.kv is not None
    tokens = ([] if prefix is None else list(prefix.tokens)) + output.tail
    tokens_verified = _tokens_sha256(tokens) == header.tokens.sha256
    if not tokens_verified:
        raise DecodeVerificationError(
            "the decoded tokens do not match the file's checksum: this machine did not "
            "reproduce the encoder's probabilities bit for bit"
        )
    recomputed = output.kv
    if list(recomputed.shape) != header.kv.shape:
        raise InvalidKVError(
            f"recomputed KV has shape {list(recomputed.shape)}, the file {header.kv.shape}"
        )
    residual_code = pending.container.residual
    kv = recomputed if residual_code is None else decode_residual(residual_code, recomputed)
    kv_verified = _sha256(kv) == header.kv.sha256
    if not kv_verified:
        raise DecodeVerificationError(
            "the rebuilt KV cache does not match the file's checksum: the recomputation on this "
            "machine differs from the encoder's"
        )
    stats = DecompressStats(
        tokens=header.tokens.count,
        decode_seconds=time.perf_counter() - pending.started,
        max_abs_residual=float((kv - recomputed).abs().max()) if kv.numel() else 0.0,
        tokens_verified=tokens_verified,
        kv_verified=kv_verified,
        forwards=output.forwards,
    )
    cache = cache_from_tensor(kv.to(model.device, model.dtype))
    return DecompressResult(tokens, cache, kv, header, stats, _trace(output.trace))


def decompress(
    model: CausalLM,
    data: bytes,
    allow_environment_mismatch: bool = False,
    progress: bool = False,
    prefixes: PrefixSource | None = None,
) -> DecompressResult:
    """Decode .skv bytes into the exact tokens and KV cache, or raise.

    A file coded after a shared prefix needs ``prefixes``, the trie that holds that prefix.
    """
    pending = _begin(model, data, allow_environment_mismatch, prefixes)
    _decode(model, [pending], with_kv=True, progress=progress)
    return _finish(model, pending)


def decompress_batch(
    model: CausalLM,
    files: Sequence[bytes],
    allow_environment_mismatch: bool = False,
    prefixes: PrefixSource | None = None,
) -> list[DecompressResult]:
    """Decode many .skv files, sharing forwards among files whose levels allow it.

    At the ``rows`` and ``segments`` levels every stream of every file adds one row to a round's
    forward, so N sessions decode in about the rounds of the longest one; files at other levels
    are decoded one by one. Each result is verified as by ``decompress``; the first failure
    raises.
    """
    pendings = [_begin(model, data, allow_environment_mismatch, prefixes) for data in files]
    _decode(model, pendings, with_kv=True)
    return [_finish(model, pending) for pending in pendings]


def decompress_tokens(
    data: bytes,
    model: CausalLM | None = None,
    prefixes: PrefixSource | None = None,
) -> list[int]:
    """Decode only the tokens (prefix included), verified against the file's checksum.

    Files at the ``ngram`` and ``plain`` levels need no model and decode on any machine; the
    others need ``model`` and a machine that reproduces the encoder's probabilities.
    """
    container = decode_container(data)
    header = container.header
    level = level_of(header)
    if level.spec.model_coded:
        if model is None:
            raise EnvironmentMismatchError(
                f"the file's tokens are coded under the model (level {header.tokens.level!r}): "
                "pass the model that coded it"
            )
        return decompress(model, data, prefixes=prefixes).tokens
    prefix = _resolve_prefix(header, prefixes, with_kv=False)
    pending = _Pending(container, level, prefix, time.perf_counter())
    _decode(None, [pending], with_kv=False)
    assert pending.output is not None
    tokens = ([] if prefix is None else list(prefix.tokens)) + pending.output.tail
    if _tokens_sha256(tokens) != header.tokens.sha256:
        raise DecodeVerificationError("the decoded tokens do not match the file's checksum")
    return tokens

"""The lossless sequential KV codec: tokens coded under the model, plus a coded KV residual.

A KV cache is a deterministic function of its tokens under a fixed computation schedule, so it is
stored as (1) the tokens, arithmetic-coded under the model's own next-token distribution, and
(2) when the caller passes the KV a run produced, the residual between it and the decoder's
recomputation, quantized at a stated tolerance and entropy-coded (``seqkv.coding.residual``).
This is layer 2 of arXiv 2604.15356 with the exact recompute as the predictor.

The codec's product is one value, ``seqkv.session.CodedSession``: ``encode`` makes it and
``decode_many`` (or ``prepare_decode`` then ``decode_prepared``) turns many of them back into
verified tokens and KV. The codec writes no bytes: the ``.skv`` file API (``seqkv.skv``:
``compress``, ``decompress``, ``upgrade``) writes the value as a file, the store in its own span
format (``seqkv.formats.span``), each without the other in between.

Invariants:
1. The encoder computes every probability along the decoder's schedule (the level's;
   ``seqkv.schedule``). The first token is coded under the model's distribution after its start
   token (BOS), or uniformly if it has none (enforced).
2. ``decode_many`` returns tokens and KV only after both match the session's digests;
   otherwise it raises DecodeVerificationError (enforced). A session whose ``kv_scope`` is
   ``tail`` has only the KV after its prefix checked: its prefix is a parent the caller verified.
3. A session coded with another model, or under a profile the decoder cannot reproduce, is
   refused before any decoding (enforced; see ``ExecutionProfile``).
4. The token code is at most the model's cross-entropy on the same tokens (the same
   probabilities) plus 2 bits plus 1.7e-5 bits per token (checked by the tests).
5. Every ``encode`` evaluates the bounds of ``seqkv.bounds`` on what it coded; a caller that
   writes bytes adds the bound that its bytes add up (``seqkv.skv.compress``: the ``.skv``
   file's sections) and commits nothing when one fails (enforced).
6. Every decode entry point (``decode_many``, and ``decode_prepared`` and
   ``decode_prepared_tokens`` through ``prepare_decode``; so the file API's ``decompress``,
   ``decompress_tokens`` and ``decompress_batch``) refuses, before any forward or table, a session
   of no tokens, a vocabulary below 2, more positions than the model's context, more tokens than
   the caller's ``max_tokens`` (default ``token_limit``) or an estimated peak above
   ``max_memory_bytes``, and at a model-free level more tokens than a floored code carries or
   (without a model) more work than ``seqkv.limits.MAX_MODEL_FREE_WORK``
   (``seqkv.levels.model_free`` invariant 3) (``CorruptFileError`` for what no honest file states,
   ``DecodeLimitError`` for the caller's limits; enforced, ``tests/test_decode_limits.py``,
   ``tests/test_work_bounds.py``). A model-free level's tokens are verified before its KV prefill.
   A floored token code (a fresh encode, ``.skv`` format 5) is decoded under the information guard
   and checked canonical after verification, its residual too; a trimmed one (formats 3 and 4) is
   checked canonical (``seqkv.session`` invariant 4).
7. A verified compress (``seqkv.skv.compress``, then its decode) runs no float forward whose result
   another already gave (enforced; counted in ``tests/test_codec_forwards.py``). With
   ``kv="prefill"`` the encoder runs the caller's prefill itself, once
   (``seqkv.bounds.shared_prefill``): its KV is the residual's target and, with no prefix, the KV
   of a level that rebuilds on the ``prefill`` schedule (the same forward, so bit for bit: the file
   is the one ``kv=model.prefill(tokens)`` gives); its rows are the reference bound's for the first
   segment. The start token is forwarded once for every segment. So a verified compress at
   ``portable`` (``seqkv compress``) runs 3 float forwards: that prefill, the start token alone
   (the reference's first row; none for a model without one) and the verifying decode's own
   prefill, which stays its own: verification rebuilds the KV from the decoded tokens, independent
   of the encoder. Without the caller's KV (``--kv none``) also 3, the reference's prefill in place
   of the shared one. The integer predictor runs twice: the encoder's pass and the verifying
   decode's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from seqkv.bounds import (
    Bound,
    Prefill,
    code_within_mixing_regret,
    code_within_reference_cross_entropy,
    code_within_table_cost,
    code_within_uniform,
    reference_surprisal,
    residual_within_tolerance,
    shared_prefill,
)
from seqkv.coding.arithmetic import OVERRUN_BITS, ArithmeticDecoder, ArithmeticEncoder
from seqkv.coding.residual import decode_residual, encode_residual
from seqkv.coding.residual_code import ResidualCode
from seqkv.descriptions import DescriptionSource
from seqkv.digests import NO_PROFILE, model_digest, profile_digest, tokens_digest
from seqkv.errors import (
    CorruptFileError,
    DecodeLimitError,
    DecodeVerificationError,
    EnvironmentMismatchError,
    InvalidArgumentTypeError,
    InvalidKVError,
    InvalidLevelError,
    InvalidTokensError,
    KVNotRecordedError,
    ModelMismatchError,
    UnsupportedVersionError,
    UsageError,
)
from seqkv.kvcache import cache_from_tensor, kv_digest, tensor_from_cache
from seqkv.levels import (
    DEFAULT_LEVEL,
    CodingLevel,
    DecodeOutput,
    DecodeRequest,
    EncodeRequest,
    KVClasses,
    TraceColumns,
    parse_level,
)
from seqkv.levels.model_free import ModelFreeLevel, check_model_free_decode
from seqkv.limits import MODEL_FREE_MAX_TOKENS, MODEL_FREE_MAX_VOCAB
from seqkv.mixing.dictionary import Dictionary
from seqkv.mixing.errors import DictionaryMismatchError, DictionaryUnavailableError
from seqkv.models.adapter import CausalLM
from seqkv.models.collisions import collision_classes
from seqkv.models.profiles import execution_profile
from seqkv.progress import ProgressSink
from seqkv.session import CodedSession, KVScope, Prefix
from seqkv.types import ExecutionProfile, Schedule

# NOTE: 1e-4 is below fp16's resolution for any KV component above 0.2 in magnitude, and above
# every drift measured between one prefill and the decoder's schedules on SmolLM2-135M (CPU):
# at most 7.1e-5 (rows, 8,192 tokens of prose) and 5.6e-5 (token by token, 512 tokens) over the
# four shipped kinds at 128-8,192 tokens (reports/residual_drift.md), so on that model the
# residual costs only its 60 group flags. The margin is 1.42x and the drift grows with length;
# a component past the tolerance costs bits (one costs its group ~1,300 bits at 8,192 tokens),
# never exactness, and no bound depends on the tolerance, so it stays at 1e-4 rather than
# trading precision for that margin. 0 means bit-exact.
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
    # H(t_i | prefix) - H(KV_i | prefix), exact, at every position (``seqkv.models.collisions``);
    # empty where the tables are not the model's (the model-free levels)
    kv_gap_bits: npt.NDArray[np.float64]

    def theorem1(self) -> Theorem1 | None:
        """Theorem 1's two sides at every coded position (None: no model distribution)."""
        gap = self.kv_gap_bits
        if gap.size == 0 or gap.size != self.entropy_bits.size:
            return None  # a level whose tables are not the model's
        top = np.argsort(-gap, kind="stable")[:TOP_POSITIONS]
        return Theorem1(
            positions=int(gap.size), token_entropy_bits=float(self.entropy_bits.sum()),
            kv_entropy_bits=float((self.entropy_bits - gap).sum()), gap_bits=float(gap.sum()),
            max_gap_bits=float(gap.max()),
            top_positions=tuple((int(i), float(gap[i])) for i in top if gap[i] > 0))


# NOTE: the positions where the gap is largest, reported by position and size.
TOP_POSITIONS = 5


@dataclass(frozen=True)
class Theorem1:
    """H(t_(i+1) | prefix) and H(KV_(i+1) | prefix) summed over every coded position, exactly:
    the KV side is the coder's own next-token distribution pushed forward through the model's
    KV-collision classes (``seqkv.models.collisions``), so no forward runs per position. Given
    Lemma 1 (a fixed schedule's KV is a function of the tokens) the gap is >= 0 by construction:
    a report figure, whose gate is Lemma 1 (``seqkv check``)."""

    positions: int
    token_entropy_bits: float
    kv_entropy_bits: float
    gap_bits: float
    max_gap_bits: float
    top_positions: tuple[tuple[int, float], ...]  # (position, gap bits), largest first

    @property
    def mean_gap_bits(self) -> float:
        return self.gap_bits / self.positions


def _trace(columns: TraceColumns) -> CodingTrace:
    return CodingTrace(np.array(columns.surprisal), np.array(columns.cost),
                       np.array(columns.entropy), np.array(columns.kv_gap))


@dataclass(frozen=True)
class Encoded:
    """What ``encode`` made: the coded session, what it cost, and what a decode rebuilds."""

    session: CodedSession
    trace: CodingTrace
    # The codec's own; a format adds its bytes' (``seqkv.skv.compress``).
    bounds: tuple[Bound, ...]
    # The KV a decode rebuilds, bit for bit; None for a portable session coded without its KV.
    kv: torch.Tensor | None
    max_abs_kv_error: float | None  # against the caller's KV, when one was given
    tolerance: float | None  # the residual's, when a KV was given
    encode_seconds: float
    forwards: int  # model forwards the encoder ran (a cached start row counts as one)
    profile: ExecutionProfile  # the full profile ``session.profile_digest`` names
    predictor_digest: str | None = None  # as ``CompressStats.predictor_digest``

    @property
    def residual_bits(self) -> int:
        return 0 if self.session.residual is None else self.session.residual.num_bits


@dataclass(frozen=True)
class DecompressStats:
    """What the decoder measured; nothing here is read from the file.

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
    kv_verified: bool  # the KV matched the session's digest (False: it could not be checked)
    tolerance: float | None  # the encoder's promise, as the session states it
    # Model forwards the decode ran; sessions decoded together share theirs (each reports the
    # total).
    forwards: int = 0
    predictor_digest: str | None = None  # as ``CompressStats.predictor_digest``

    @property
    def verified(self) -> bool:
        return self.tokens_verified and self.kv_verified


@dataclass(frozen=True)
class DecompressResult:
    tokens: list[int]
    cache: DynamicCache
    kv: torch.Tensor  # [layers, 2, kv_heads, tokens, head_dim], float32
    session: CodedSession
    stats: DecompressStats
    trace: CodingTrace
    # The KV is bit for bit the encoder's (verified against the session's digest). False only
    # at a portable level decoded under another execution profile, or coded without its KV (no
    # digest recorded): the tokens are exact and verified, the KV is this machine's
    # recomputation with the stored residual (if any) applied.
    kv_exact: bool


class DictionarySource(Protocol):
    """Where a decoder finds mixing dictionaries by digest (``seqkv.cli.dict.DictionaryFile``,
    a store, or a mapping)."""

    def get(self, digest: str) -> Dictionary | None: ...


def _check_prefix(model: CausalLM, tokens: list[int], prefix: Prefix) -> None:
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


PrefillKV = Literal["prefill"]
"""``kv="prefill"``: the caller's KV is this machine's prefill of the tokens
(``CausalLM.prefill``), and ``encode`` runs it, once (module invariant 7)."""


def _caller_kv(kv: DynamicCache | torch.Tensor | None) -> torch.Tensor | None:
    if kv is None:
        return None
    target = tensor_from_cache(kv) if isinstance(kv, DynamicCache) else kv
    return target.detach().to("cpu", torch.float32)


def _classes(model: CausalLM | None, level: CodingLevel) -> KVClasses | None:
    """The model's KV-collision classes where the level codes under the model's distribution
    (Theorem 1's exact gap in the trace), else None."""
    if model is None or not level.spec.model_coded:
        return None
    return tuple(collision_classes(model).index_arrays())


def _level(level: CodingLevel | str) -> CodingLevel:
    return parse_level(level) if isinstance(level, str) else level


def encode(
    model: CausalLM,
    tokens: Sequence[int],
    kv: DynamicCache | torch.Tensor | PrefillKV | None = None,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    prefix: Prefix | None = None,
    level: CodingLevel | str = DEFAULT_LEVEL,
    dictionary: Dictionary | None = None,
    record_kv: bool = False,
    kv_scope: KVScope = "all",
    progress: ProgressSink | None = None,
    reference: npt.NDArray[np.float64] | None = None,
) -> Encoded:
    """Code ``tokens`` (and the residual of ``kv``) into a ``CodedSession``, with its bounds.

    See ``seqkv.skv.compress`` for the arguments. ``kv_scope="tail"`` makes the KV digest cover
    only the positions after ``prefix`` (a store span, whose prefix its parent span vouches
    for). The bounds are returned, not raised: the caller that writes bytes adds its own and
    raises.
    ``reference`` is the tail's ``-log2 p`` under one prefill of the model that a caller
    computed already (``seqkv check`` shares one prefill): the reference bound reads it instead
    of running its own (it must be what ``seqkv.bounds.reference_surprisal`` computes).
    ``kv="prefill"`` runs the caller's prefill here, shared (module invariant 7).

    >>> from seqkv.models import tiny_random_llama
    >>> model = tiny_random_llama()
    >>> encoded = encode(model, [5, 17, 17, 3])
    >>> decode_many(model, [DecodeItem(encoded.session)])[0].tokens
    [5, 17, 17, 3]
    """
    token_list = [int(t) for t in tokens]
    model.check_tokens(token_list)
    if prefix is not None:
        _check_prefix(model, token_list, prefix)
    tail = token_list[len(prefix.tokens) if prefix is not None else 0 :]
    coding_level = _level(level)
    spec = coding_level.spec
    if dictionary is not None and not spec.mixes:
        raise InvalidLevelError(f"level {spec.name!r} takes no dictionary: code at "
                                "portable+mix to use one")
    prefilled: Prefill | None = None
    if isinstance(kv, str):
        if kv != "prefill":
            raise InvalidArgumentTypeError(
                f"kv={kv!r}: pass a KV cache or tensor, None, or 'prefill' (this machine's "
                "prefill of the tokens, run by the encoder)")
        prefilled = shared_prefill(model, token_list, with_surprisal=reference is None
                                   and spec.reference == "model")
        target: torch.Tensor | None = prefilled.kv
    else:
        target = _caller_kv(kv)
    context = model.start_token_id
    started = time.perf_counter()
    encoder = ArithmeticEncoder()
    encoded = coding_level.encode(EncodeRequest(
        model, tail, prefix, context, encoder, progress, dictionary,
        with_kv=target is not None or record_kv, classes=_classes(model, coding_level),
        prefilled=prefilled.kv if prefilled is not None and prefix is None else None))
    token_code = encoder.finish()
    residual = None
    rebuilt = encoded.kv
    max_error = None
    if target is not None:
        assert encoded.kv is not None, "a level returns the KV when asked for it"
        residual, rebuilt = encode_residual(target, encoded.kv, tolerance)
        max_error = float((rebuilt - target).abs().max())
    encode_seconds = time.perf_counter() - started
    profile = execution_profile(model, spec.schedule)
    skip = len(prefix.tokens) if prefix is not None and kv_scope == "tail" else 0
    session = CodedSession(
        level=spec.name,
        count=len(tail),
        segments=tuple(encoded.segments),
        vocab_size=None if spec.model_coded else model.vocab_size,
        model_digest=model_digest(model.identity),
        profile_digest=profile_digest(profile) if rebuilt is not None else NO_PROFILE,
        tokens_digest=tokens_digest(token_list),
        kv_digest=None if rebuilt is None else kv_digest(rebuilt[:, :, :, skip:]),
        prefix=prefix.ref() if prefix is not None and prefix.prefix_hash is not None else None,
        dictionary=None if dictionary is None else str(dictionary.digest),
        token_code=token_code,
        residual=residual,
        kv_scope=kv_scope, code_form="floored",
    )
    trace = _trace(encoded.trace)
    bounds = _bounds(model, coding_level, tail, encoded.segments, context, prefix,
                     token_code.num_bits, trace, residual, max_error, tolerance, reference,
                     prefilled)
    return Encoded(session, trace, bounds, rebuilt, max_error,
                   None if residual is None else residual.tolerance, encode_seconds,
                   encoded.forwards, profile, encoded.predictor_digest)


def _bounds(model: CausalLM, level: CodingLevel, tail: list[int], lengths: list[int],
            context: int | None, prefix: Prefix | None, code_bits: int,
            trace: CodingTrace, residual: ResidualCode | None, max_error: float | None,
            tolerance: float, reference: npt.NDArray[np.float64] | None = None,
            prefilled: Prefill | None = None) -> tuple[Bound, ...]:
    """The cheap bounds of ``seqkv.bounds`` on what ``encode`` has just coded (the reference
    reads ``prefilled``'s rows where it has them)."""
    bounds = [code_within_table_cost(code_bits, float(trace.code_cost_bits.sum()))]
    if level.spec.reference == "model":
        if reference is None:
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
            segments = [tail[offsets[j] : offsets[j + 1]] for j in range(len(lengths))]
            reference = reference_surprisal(model, segments, context,
                                            prefix.tokens if prefix is not None else (),
                                            prefilled=prefilled)
        bounds.append(code_within_reference_cross_entropy(
            code_bits, float(reference.sum()), len(tail), model.vocab_size,
            level.spec.reference_allowance))
    elif level.spec.reference == "uniform":
        bounds.append(code_within_uniform(code_bits, len(tail), model.vocab_size))
    if level.spec.mixes:
        bounds.append(code_within_mixing_regret(code_bits, float(trace.surprisal_bits.sum())))
    if residual is not None and max_error is not None:
        bounds.append(residual_within_tolerance(max_error, tolerance, residual.num_bits,
                                                residual.num_escapes))
    return tuple(bounds)


def level_of(session: CodedSession) -> CodingLevel:
    """The coding level a session records, or UnsupportedVersionError for one unknown here."""
    try:
        return parse_level(session.level)
    except InvalidLevelError:
        raise UnsupportedVersionError(
            f"the file was coded at level {session.level!r}, which this seqkv does not know: "
            "use the seqkv release that wrote it"
        ) from None


def kv_schedule(model: CausalLM, session: CodedSession) -> Schedule:
    """The schedule to rebuild the session's KV on: its level's own, or a former one of the
    level's (``LevelSpec.former_schedules``: earlier releases computed the level's KV on it)
    whose execution profile on this machine is the one the session names. Elsewhere the level's
    own: the session's profile then matches none, and its KV is not reproduced exactly anyway.

    Trying a former ``rows`` profile builds the model's row-invariant forward (its row-block
    calibration runs once per process), only for a file whose profile is not this machine's own
    for the level."""
    spec = level_of(session).spec
    own = spec.schedule
    if not spec.former_schedules or session.kv_digest is None or profile_digest(
            execution_profile(model, own)) == session.profile_digest:
        return own
    for former in spec.former_schedules:
        if profile_digest(execution_profile(model, former)) == session.profile_digest:
            return former
    return own


def reproduces_profile(model: CausalLM, session: CodedSession) -> bool:
    """Whether this machine's execution profile for the session's KV (on ``kv_schedule``) is
    the one the session records. Where it is not, ``check_decodable`` refuses a float level
    (``EnvironmentMismatchError``); a portable level still decodes, its KV unverified."""
    return profile_digest(execution_profile(model, kv_schedule(model, session))) == \
        session.profile_digest


def check_decodable(model: CausalLM, session: CodedSession, allow_environment_mismatch: bool,
                    descriptions: DescriptionSource | None = None,
                    require_exact_kv: bool = False) -> bool:
    """Raise unless ``model`` on this machine can decode the session; return whether its KV can
    be reproduced (and so verified) here.

    A session names its model and execution profile by digest; when ``descriptions`` holds the
    session's profile, a mismatch is explained field by field, else by digest. At a portable
    level (tokens coded without float probabilities) another profile is no refusal: the tokens
    decode and verify anywhere, and the KV is reported inexact, unless ``require_exact_kv``.
    """
    level = level_of(session)
    if model_digest(model.identity) != session.model_digest:
        recorded_model = descriptions.model(session.model_digest) if descriptions else None
        theirs = (f"model {recorded_model.name!r} (weights {recorded_model.weights_sha256[:12]})"
                  if recorded_model is not None else
                  f"another model (digest {session.model_digest.hex()})")
        raise ModelMismatchError(
            f"the file was coded with {theirs}, not with {model.name!r} (weights "
            f"{model.identity.weights_sha256[:12]}, digest "
            f"{model_digest(model.identity).hex()}): decode it with the model that coded it"
        )
    if session.kv_digest is None:  # a portable session coded without its KV: tokens only
        if require_exact_kv:
            raise KVNotRecordedError(
                "the file records no KV (it was coded without one), so no decoder can verify "
                "the KV it recomputes: decode without require_exact_kv (CLI: without "
                "--require-exact-kv) for the exact tokens and a recomputed KV")
        return False
    if reproduces_profile(model, session):
        return True
    here = execution_profile(model, kv_schedule(model, session))
    recorded = descriptions.profile(session.profile_digest) if descriptions else None
    if level.spec.portable and not require_exact_kv:
        return False
    portable = "" if not level.spec.portable else (
        "; its tokens are portable: decode without require_exact_kv (CLI: without "
        "--require-exact-kv) for the tokens and a recomputed KV")
    if recorded is None:
        if allow_environment_mismatch:
            return True
        root = getattr(descriptions, "root", None)
        where = f" in {root}" if root is not None else ""
        raise EnvironmentMismatchError(
            f"the file was coded under another execution profile (digest "
            f"{session.profile_digest.hex()}, this machine {profile_digest(here).hex()}; its "
            f"description is not at hand{where}), so exact decoding is unlikely. Pass "
            "allow_environment_mismatch=True (CLI: --allow-environment-mismatch) to try: the "
            "checksums still catch any error" + portable)
    hard = recorded.hard_mismatches(here)
    if hard:
        raise EnvironmentMismatchError(
            "this machine cannot reproduce the encoder's probabilities and KV: "
            + "; ".join(hard) + portable
        )
    soft = recorded.soft_mismatches(here)
    if soft and not allow_environment_mismatch:
        raise EnvironmentMismatchError(
            "the file was coded under another environment (" + "; ".join(soft) + "); exact "
            "decoding is unlikely. Pass allow_environment_mismatch=True (CLI: "
            "--allow-environment-mismatch) to try anyway: the checksums still catch any error"
            + portable
        )
    return True


def resolve_dictionary(session: CodedSession,
                       dictionaries: DictionarySource | None) -> Dictionary | None:
    """The mixing dictionary a session was coded with, from ``dictionaries``, checked."""
    if session.dictionary is None:
        return None
    found = None if dictionaries is None else dictionaries.get(session.dictionary)
    if found is None:
        raise DictionaryUnavailableError(
            f"the file was coded with the mixing dictionary {session.dictionary[:16]}...: pass "
            "it (CLI: --dict DICT)")
    if str(found.digest) != session.dictionary:
        raise DictionaryMismatchError(
            f"the dictionary given has digest {str(found.digest)[:16]}..., the file needs "
            f"{session.dictionary[:16]}...")
    return found


@dataclass(frozen=True)
class _Given:
    """One dictionary as a ``DictionarySource``."""

    dictionary: Dictionary | None

    def get(self, digest: str) -> Dictionary | None:
        return self.dictionary


@dataclass(frozen=True)
class DecodeItem:
    """One session to decode: the prefix it continues (checked against its reference, if it
    names one) and the dictionary it was coded with (checked by digest)."""

    session: CodedSession
    prefix: Prefix | None = None
    dictionary: Dictionary | None = None


@dataclass
class PendingDecode:
    """A session between checking and verification."""

    item: DecodeItem
    level: CodingLevel
    started: float
    context: int | None  # the start token the first token was coded after
    vocab_size: int
    kv_checkable: bool = True  # this machine reproduces the encoder's KV (its profile)
    kv_schedule: Schedule | None = None  # as ``kv_schedule`` names it (None: the level's own)
    output: DecodeOutput | None = None
    classes: KVClasses | None = None
    decoder: ArithmeticDecoder | None = None

    def request(self, with_kv: bool, progress: ProgressSink | None = None) -> DecodeRequest:
        session = self.item.session
        lengths = list(session.segments)
        if sum(lengths) != session.count or min(lengths, default=0) < 1:
            raise CorruptFileError("the file's segment lengths are not positive or do not add "
                                   "up to its token count")
        self.decoder = ArithmeticDecoder(
            session.token_code, OVERRUN_BITS if session.code_form == "floored" else None)
        prefix = self.item.prefix
        before = [] if prefix is None else list(prefix.tokens)
        return DecodeRequest(self.decoder, session.count, lengths, self.context,
                             self.vocab_size, prefix, with_kv, progress,
                             self.item.dictionary, self.classes, self.kv_schedule,
                             check_tokens=lambda tail: verify(session, before + list(tail),
                                                              None, 0, kv_checkable=False),
                             # a tokens-only decode (``decode_prepared_tokens``) has no trace
                             with_figures=with_kv)

    def check_code(self) -> None:
        """After the decode and its verification: the token code is the one its writer writes
        (``code_form``); the tokens are right, so a difference is a non-canonical file."""
        form = self.item.session.code_form
        if self.decoder is None:
            return
        if form == "bytes" and not self.decoder.canonical_bytes():
            raise CorruptFileError(
                "the token code is not the one its writer writes for the tokens it decodes to "
                "(bytes appended or dropped, or bits changed past the code's end)")
        if form != "bytes" and not self.decoder.canonical(floor=form == "floored"):
            raise CorruptFileError(
                "the file's token code is not the one its writer writes for the tokens it "
                "decodes to (bits appended, dropped or changed past the code's end)")


def _pending(item: DecodeItem, model: CausalLM | None, limits: DecodeLimits,
             with_kv: bool = True) -> PendingDecode:
    session = item.session
    level = level_of(session)
    context = model.start_token_id if model is not None else None
    vocab = session.vocab_size if session.vocab_size is not None else (
        model.vocab_size if model is not None else None)
    if vocab is None:
        raise CorruptFileError("the file's model-free level does not record the vocabulary "
                               "size")
    if (item.dictionary is None) != (session.dictionary is None) or (
            item.dictionary is not None and str(item.dictionary.digest) != session.dictionary):
        resolve_dictionary(session, _Given(item.dictionary))  # raises the error that applies
        raise DictionaryMismatchError("the session was coded without a mixing dictionary: "
                                      "decode it without one")
    _check_sizes(session, level, model, vocab, item.prefix, limits, with_kv)
    schedule = kv_schedule(model, session) if model is not None and with_kv else None
    return PendingDecode(item, level, time.perf_counter(), context, vocab,
                    classes=_classes(model, level), kv_schedule=schedule)


# NOTE: what a decode holds per token beyond its KV (docs/guides/limits.md, "Bounded
# decoding"): the decoded ids and the trace's per-position floats (Python lists, ~24-32 bytes
# an entry), about 150 bytes a token; per vocabulary entry, the tables one step builds
# (weights, cumulative counts, log2-probabilities, entropy terms: int64 and float64), about
# 48 bytes.
DECODE_BYTES_PER_TOKEN = 256
DECODE_BYTES_PER_SYMBOL = 64
# NOTE: copies of the KV a verified decode holds at once: the stepper's cache, the rebuilt
# tensor, the residual-corrected one and the returned cache (float32 on CPU).
_KV_COPIES = 4


def _positive(value: int | None, name: str) -> int | None:
    """``value`` if it is None or a positive integer, else a ``SeqKVError``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(
            f"{name} must be an integer or None, not {type(value).__name__}")
    if value < 1:
        raise UsageError(f"{name} must be at least 1, not {value}")
    return value


@dataclass(frozen=True)
class DecodeLimits:
    """A caller's limits on one decode: tokens (default: the model's context, or
    ``MODEL_FREE_MAX_TOKENS`` without a model) and estimated peak memory in bytes (default:
    none beyond what the token limit implies; ``decode_memory_bytes``)."""

    max_tokens: int | None = None
    max_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        _positive(self.max_tokens, "max_tokens")
        _positive(self.max_memory_bytes, "max_memory_bytes")


def decode_memory_bytes(model: CausalLM | None, count: int, positions: int, vocab: int,
                        with_kv: bool) -> int:
    """An upper estimate of what decoding ``count`` tokens (``positions`` with the prefix) over
    ``vocab`` symbols holds at its peak, beyond the loaded model: the KV copies (with a model and
    ``with_kv``), the per-token lists and one step's tables."""
    kv = 0
    if model is not None and with_kv:
        kv = _KV_COPIES * positions * 4 * model.kv_components_per_token
    return kv + DECODE_BYTES_PER_TOKEN * count + DECODE_BYTES_PER_SYMBOL * vocab


def token_limit(model: CausalLM | None, max_tokens: int | None) -> int:
    """The most tokens one decode may produce: the caller's ``max_tokens``, else the model's
    context, else (no model) ``MODEL_FREE_MAX_TOKENS``."""
    if max_tokens is not None:
        return max_tokens
    context = None if model is None else getattr(model.config, "max_position_embeddings", None)
    return context if isinstance(context, int) and context > 0 else MODEL_FREE_MAX_TOKENS


def _check_sizes(session: CodedSession, level: CodingLevel, model: CausalLM | None, vocab: int,
                 prefix: Prefix | None, limits: DecodeLimits, with_kv: bool) -> None:
    """Refuse, before any allocation or forward, a session whose sizes this decode cannot
    honour: no tokens, a vocabulary below 2, more positions than the model's context, more
    tokens than the caller's limit (default ``token_limit``), an estimated peak memory above
    the caller's budget, without a model a vocabulary above ``MODEL_FREE_MAX_VOCAB``, and at a
    model-free level what ``seqkv.levels.model_free.check_model_free_decode`` refuses (more tokens
    than a guarded code carries; without a model, more work than ``MAX_MODEL_FREE_WORK``)."""
    positions = session.count + (len(prefix.tokens) if prefix is not None else 0)
    if session.count < 1:
        raise CorruptFileError("the file declares no tokens")
    if vocab < 2:
        raise CorruptFileError(f"the file declares a vocabulary of {vocab}: a token stream "
                               "needs at least 2 symbols")
    limit = token_limit(model, limits.max_tokens)
    if session.count > limit:
        raise DecodeLimitError(
            f"the file declares {session.count:,} tokens, more than the {limit:,} this decode "
            "allows (max_tokens; CLI: --max-tokens)")
    budget = limits.max_memory_bytes
    needed = decode_memory_bytes(model, session.count, positions, vocab, with_kv)
    if budget is not None and needed > budget:
        raise DecodeLimitError(
            f"decoding the file's {session.count:,} tokens would hold about {needed:,} bytes, "
            f"more than the budget of {budget:,} (max_memory_bytes; CLI: --max-memory-mb)")
    if model is not None:
        context = int(getattr(model.config, "max_position_embeddings", positions))
        if positions > context:
            raise CorruptFileError(
                f"the file declares {positions:,} positions, more than the model's context of "
                f"{context:,}")
        if vocab != model.vocab_size:
            raise CorruptFileError(f"the file declares a vocabulary of {vocab:,}, the model has "
                                   f"{model.vocab_size:,}")
    elif vocab > MODEL_FREE_MAX_VOCAB:
        raise DecodeLimitError(
            f"the file declares a vocabulary of {vocab:,}: more than a model-free decode "
            f"allows ({MODEL_FREE_MAX_VOCAB:,}); pass the model, whose vocabulary bounds it")
    if isinstance(level, ModelFreeLevel):
        check_model_free_decode(level, vocab, positions, session.count, session.token_code,
                                guarded=session.code_form == "floored", capped=model is None)


def _decode_levels(model: CausalLM | None, pendings: Sequence[PendingDecode], with_kv: bool,
                   progress: ProgressSink | None = None) -> None:
    """Decode every pending session at its level; sessions whose levels share a batch group
    decode in one call, sharing its forwards."""
    groups: dict[object, list[PendingDecode]] = {}
    for index, pending in enumerate(pendings):
        key = pending.level.spec.batch_group or ("alone", index)
        groups.setdefault(key, []).append(pending)
    for group in groups.values():
        outputs = group[0].level.decode(model, [p.request(with_kv, progress) for p in group])
        for pending, output in zip(group, outputs, strict=True):
            pending.output = output


def verify(session: CodedSession, tokens: Sequence[int], kv: torch.Tensor | None,
           prefix_length: int, kv_checkable: bool) -> None:
    """Check decoded tokens (all, the prefix's included) and KV against the session's digests;
    raise ``DecodeVerificationError`` on a mismatch."""
    if tokens_digest(tokens) != session.tokens_digest:
        raise DecodeVerificationError(
            "the decoded tokens do not match the file's checksum: this machine did not "
            "reproduce the encoder's probabilities bit for bit"
        )
    if kv_checkable and kv is not None:
        skip = prefix_length if session.kv_scope == "tail" else 0
        if kv_digest(kv[:, :, :, skip:]) != session.kv_digest:
            raise DecodeVerificationError(
                "the rebuilt KV cache does not match the file's checksum: the recomputation on "
                "this machine differs from the encoder's"
            )


def _finish(model: CausalLM, pending: PendingDecode) -> DecompressResult:
    """Rebuild the KV, then verify tokens and KV."""
    session = pending.item.session
    prefix = pending.item.prefix
    output = pending.output
    assert output is not None and output.kv is not None
    tokens = ([] if prefix is None else list(prefix.tokens)) + output.tail
    recomputed = output.kv
    expected = (model.num_layers, 2, model.kv_heads, len(tokens), model.head_dim)
    if tuple(recomputed.shape) != expected:
        raise DecodeVerificationError(
            f"the decoder rebuilt KV of shape {list(recomputed.shape)}, not {list(expected)}")
    residual_code = session.residual
    kv = recomputed if residual_code is None else decode_residual(
        residual_code.with_shape(tuple(recomputed.shape)), recomputed,
        canonical=session.code_form == "floored")
    verify(session, tokens, kv, len(tokens) - session.count, pending.kv_checkable)
    pending.check_code()
    stats = DecompressStats(
        tokens=session.count,
        decode_seconds=time.perf_counter() - pending.started,
        max_abs_residual=float((kv - recomputed).abs().max()) if kv.numel() else 0.0,
        tokens_verified=True,
        kv_verified=pending.kv_checkable,
        tolerance=None if residual_code is None else residual_code.tolerance,
        forwards=output.forwards,
        predictor_digest=output.predictor_digest,
    )
    cache = cache_from_tensor(kv.to(model.device, model.dtype))
    return DecompressResult(tokens, cache, kv, session, stats, _trace(output.trace),
                            pending.kv_checkable)


def prepare_decode(model: CausalLM | None, item: DecodeItem, limits: DecodeLimits, *,
                   kv_checkable: bool = True, with_kv: bool = True) -> PendingDecode:
    """One session checked for its sizes and dictionary (``_check_sizes``), before any forward
    or table; ``kv_checkable`` is what ``check_decodable`` returned for it (a caller runs that
    first). Without ``model``, a model-free level's tokens only."""
    pending = _pending(item, model, limits, with_kv)
    pending.kv_checkable = kv_checkable
    return pending


def decode_prepared(model: CausalLM, pendings: Sequence[PendingDecode],
                    progress: ProgressSink | None = None) -> list[DecompressResult]:
    """Decode prepared sessions (``prepare_decode``) into verified tokens and KV, sharing
    forwards as ``decode_many`` does."""
    _decode_levels(model, pendings, with_kv=True, progress=progress)
    return [_finish(model, pending) for pending in pendings]


def decode_prepared_tokens(model: CausalLM | None, pending: PendingDecode) -> list[int]:
    """The tokens (prefix included) of a session prepared with ``with_kv=False``, verified
    against its tokens digest and its token code checked canonical; no KV is rebuilt."""
    _decode_levels(model, [pending], with_kv=False)
    prefix = pending.item.prefix
    assert pending.output is not None
    tokens = ([] if prefix is None else list(prefix.tokens)) + pending.output.tail
    verify(pending.item.session, tokens, None, 0, kv_checkable=False)
    pending.check_code()
    return tokens


def decode_many(
    model: CausalLM,
    items: Sequence[DecodeItem],
    *,
    allow_environment_mismatch: bool = False,
    descriptions: DescriptionSource | None = None,
    require_exact_kv: bool = False,
    progress: ProgressSink | None = None,
    max_tokens: int | None = None,
    max_memory_bytes: int | None = None,
) -> list[DecompressResult]:
    """Decode coded sessions into verified tokens and KV, sharing forwards among sessions whose
    levels allow it.

    A session of more than ``max_tokens`` tokens (default: the model's context) is refused with
    ``DecodeLimitError`` before any forward, as is one whose decode would need more memory than
    ``max_memory_bytes`` (``decode_memory_bytes``).

    At the ``rows``, ``segments`` and ``portable`` levels every stream of every session adds
    rows to a round's forward, so N sessions decode in about the rounds of the longest one;
    sessions at other levels are decoded one by one. Every session is checked before any
    decodes, and verified after (module invariant 2); the first failure raises.
    """
    limits = DecodeLimits(max_tokens, max_memory_bytes)
    pendings = [prepare_decode(model, item, limits, kv_checkable=check_decodable(
        model, item.session, allow_environment_mismatch, descriptions, require_exact_kv))
        for item in items]
    return decode_prepared(model, pendings, progress)


"""The two ``SpanCodec``s: the model's (any level), and a model-free tokens-only one.

``ModelCodec`` codes a span with the codec (``seqkv.codec.encode``, the stored prefix as a
``seqkv.session.Prefix``) and decodes many spans together with ``seqkv.codec.decode_many``
(sessions at the ``rows``, ``segments`` and ``portable`` levels share forwards). A span's fields
become a ``CodedSession`` with the model, profile, level and vocabulary of the codec's identity,
which the store keeps once; no ``.skv`` file is written or parsed on the way.

``TokensCodec`` keeps token streams only, at the ``plain`` or ``ngram`` level, with no model at
all (stores of token streams; the index measured at scale without model forwards). It runs the
levels' own model-free loop (``seqkv.levels.model_free``) without the per-position figures, and
their checks before it (``check_model_free_decode``: the model-free caps, and on a record of
version 3 the tokens its code carries, then the information guard).

Invariants:
1. ``decode_many`` returns nothing it has not checked against the span's digests: the chain's
   tokens always, the KV wherever this worker's execution profile can reproduce it (elsewhere a
   portable level's KV is returned recomputed, ``kv_exact`` False) (enforced).
2. ``ModelCodec.encode`` reports as ``EncodedSpan.kv`` the KV a decoder rebuilds, which the
   encoder computed and digested (enforced), so the store never codes a child against KV a
   decoder would not rebuild.
3. Each codec reads the version-1 records of its former release (``reader``): their identities
   are rebuilt here field for field, so stores written before keep decoding (tested on a
   committed store).
4. At a portable level (``plain``, ``ngram``, ``portable``, ``portable+mix``, ``portable4``)
   a store written on another machine reads: its codec identity differs from this worker's in
   the execution profile only, and ``reader`` gives a decode-only codec bound to that profile,
   so the tokens verify and the KV is recomputed (``kv_exact`` False). Any other difference,
   or another profile at a float level, is no reader (enforced; ``tests/test_store_codec.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, replace

import torch

from seqkv.bounds import (
    Bound,
    code_within_table_cost,
    code_within_uniform,
    raise_unless_all_hold,
)
from seqkv.codec import (
    DEFAULT_TOLERANCE,
    DecodeItem,
    decode_many,
    encode,
    verify,
)
from seqkv.coding.arithmetic import OVERRUN_BITS, ArithmeticDecoder, ArithmeticEncoder, BitStream
from seqkv.descriptions import profile_of
from seqkv.digests import NO_PROFILE, model_digest, profile_digest, tokens_digest
from seqkv.errors import (
    CodeExhaustedError,
    DecodeLimitError,
    DecodeVerificationError,
    InvalidTokensError,
    SeqKVError,
)
from seqkv.formats.span import SpanRecord
from seqkv.levels import CodingLevel, parse_level
from seqkv.levels.base import TraceColumns
from seqkv.levels.model_free import (
    ModelFreeLevel,
    check_model_free_decode,
    code_tokens,
    decode_tokens,
)
from seqkv.limits import MODEL_FREE_MAX_TOKENS
from seqkv.mixing.dictionary import Dictionary
from seqkv.mixing.errors import DictionaryError
from seqkv.models.adapter import CausalLM
from seqkv.models.profiles import execution_profile
from seqkv.session import CodedSession, Prefix, split_lengths
from seqkv.store.backends.base import CodecIdentity
from seqkv.store.codec import DecodedSpan, EncodedSpan, SpanItem, StoredReader
from seqkv.store.errors import CodecMismatchError, CorruptRecordError, StoreVerificationError
from seqkv.types import ExecutionProfile

DEFAULT_STORE_LEVEL = "portable"
"""The level a store codes at unless told otherwise: tokens that decode on any machine."""


def _segments(level: CodingLevel, count: int) -> tuple[int, ...]:
    """A level's segment lengths for ``count`` tokens (only ``segments:N`` splits them)."""
    family, _, parameter = level.spec.name.partition(":")
    return tuple(split_lengths(count, int(parameter))) if family == "segments" else (count,)


def session_of(record: SpanRecord, level: CodingLevel, base: CodedSession) -> CodedSession:
    """The coded session a record holds, with the codec-wide fields of ``base``."""
    return replace(base, count=record.count, segments=_segments(level, record.count),
                   tokens_digest=record.tokens_digest, kv_digest=record.kv_digest,
                   dictionary=record.dictionary, token_code=record.token_code,
                   residual=record.residual, kv_scope=record.kv_scope,
                   code_form=record.code_form)


def _recorded_profile(identity: CodecIdentity) -> ExecutionProfile | None:
    """The execution profile a stored model codec's description names, if it names one."""
    try:
        description = json.loads(identity.description)
    except ValueError:
        return None
    return profile_of(description.get("profile")) if isinstance(description, dict) else None


class ModelCodec:
    """``SpanCodec`` over ``seqkv.codec``: one model, one level, one tolerance."""

    def __init__(self, model: CausalLM, level: CodingLevel | str = DEFAULT_STORE_LEVEL,
                 tolerance: float = DEFAULT_TOLERANCE, *,
                 coded_on: ExecutionProfile | None = None) -> None:
        """``coded_on``: the execution profile of the machine that coded the spans this codec
        will decode (another machine's; see ``reader``); such a codec only decodes."""
        self._model = model
        self._level = parse_level(level) if isinstance(level, str) else level
        self._tolerance = tolerance
        self._coded_on = coded_on
        self._profile = (coded_on if coded_on is not None
                         else execution_profile(model, self._level.spec.schedule))
        self._identity = CodecIdentity.of(self._description(legacy=False))
        self._legacy = CodecIdentity.of(self._description(legacy=True))

    @property
    def model(self) -> CausalLM:
        return self._model

    @property
    def level(self) -> CodingLevel:
        return self._level

    @property
    def uses_kv(self) -> bool:
        return True

    @property
    def mixes(self) -> bool:
        return self._level.spec.mixes

    @property
    def max_prefix_error(self) -> float:
        return self._tolerance

    @property
    def max_tokens(self) -> int | None:
        context = getattr(self._model.config, "max_position_embeddings", None)
        return context if isinstance(context, int) and context > 0 else None

    def _description(self, legacy: bool) -> dict[str, object]:
        """The identity's description; ``legacy``: as the former ``.skv`` adapter wrote it
        (version 2, record format 3), whose spans are version-1 records."""
        model = self._model
        description: dict[str, object] = {
            "model": asdict(model.identity), "profile": asdict(self._profile),
            "level": self._level.spec.name, "tolerance": self._tolerance,
            "vocab_size": model.vocab_size}
        if legacy:
            description |= {"codec": "seqkv.store.skv-adapter", "version": 2, "format": 3}
            if self.mixes:
                description["payload"] = "dictionary"
        else:
            description |= {"codec": "seqkv.store.model", "version": 3, "record": 2}
        return description

    def identity(self) -> CodecIdentity:
        return self._identity

    def reader(self, identity: CodecIdentity) -> StoredReader | None:
        if identity.digest == self._identity.digest:
            return self, None
        if identity.digest == self._legacy.digest:
            return self, "skv+dictionary" if self.mixes else "skv"
        if self._coded_on is not None or not self._level.spec.portable:
            return None
        coded_on = _recorded_profile(identity)
        if coded_on is None:
            return None
        return ModelCodec(self._model, self._level, self._tolerance,
                          coded_on=coded_on).reader(identity)

    def encode(self, tokens: Sequence[int], kv: torch.Tensor | None, prefix: Prefix | None,
               dictionary: Dictionary | None) -> EncodedSpan:
        if self._coded_on is not None:
            raise CodecMismatchError(
                "this codec decodes spans another machine coded; code new spans with this "
                "worker's own codec for the level (CodecRegistry.for_level)")
        # a store's span always carries the KV digest (record_kv)
        encoded = encode(self._model, tokens, kv, tolerance=self._tolerance, prefix=prefix,
                         level=self._level, dictionary=dictionary, record_kv=True,
                         kv_scope="tail")
        raise_unless_all_hold(encoded.bounds)
        return EncodedSpan(encoded.session, encoded.bounds, encoded.trace.theorem1(),
                           encoded.kv, encoded.max_abs_kv_error in (None, 0.0))

    def _base(self) -> CodedSession:
        """The fields every span of this codec shares (the rest come from its record)."""
        spec = self._level.spec
        return CodedSession(
            level=spec.name, count=0, segments=(), vocab_size=None if spec.model_coded
            else self._model.vocab_size, model_digest=model_digest(self._model.identity),
            profile_digest=profile_digest(self._profile), tokens_digest=NO_PROFILE,
            kv_digest=None, prefix=None, dictionary=None,
            token_code=BitStream(b"", 0), residual=None)

    def decode_many(self, items: Sequence[SpanItem]) -> list[DecodedSpan]:
        base = self._base()
        decode_items = [DecodeItem(session_of(item.record, self._level, base), item.prefix,
                                   item.dictionary) for item in items]
        try:
            decoded = decode_many(self._model, decode_items)
        except DecodeVerificationError as error:
            raise StoreVerificationError(
                f"{error}: this worker did not reproduce the encoder's probabilities and KV bit "
                "for bit, or the span was coded against another prefix") from error
        except SeqKVError as error:
            if isinstance(error, StoreVerificationError | DictionaryError):
                raise
            raise CorruptRecordError(f"a span does not decode: {error}") from error
        return [DecodedSpan(result.tokens, result.kv, result.kv_exact) for result in decoded]


class TokensCodec:
    """``SpanCodec`` for tokens only, at the ``plain`` or ``ngram`` level: no model, no KV."""

    def __init__(self, vocab_size: int, level: str = "plain") -> None:
        coding_level = parse_level(level)
        if not isinstance(coding_level, ModelFreeLevel):
            raise InvalidTokensError(f"TokensCodec codes at 'plain' or 'ngram', not {level!r}")
        self._level = coding_level
        self._vocab = vocab_size
        self._identity = CodecIdentity.of({"codec": "seqkv.store.tokens", "version": 2,
                                           "level": coding_level.spec.name,
                                           "vocab_size": vocab_size})
        self._legacy = CodecIdentity.of({"codec": "seqkv.store.portable-tokens", "version": 1,
                                         "level": coding_level.spec.name,
                                         "vocab_size": vocab_size})

    @property
    def uses_kv(self) -> bool:
        return False

    @property
    def mixes(self) -> bool:
        return False

    @property
    def max_prefix_error(self) -> float:
        return math.inf

    @property
    def max_tokens(self) -> int | None:
        """The model-free token cap that files have (``seqkv.limits.MODEL_FREE_MAX_TOKENS``): a
        row or span claiming more is refused before any decode, as a ``.skv`` file is."""
        return MODEL_FREE_MAX_TOKENS

    def identity(self) -> CodecIdentity:
        return self._identity

    def reader(self, identity: CodecIdentity) -> StoredReader | None:
        if identity.digest == self._identity.digest:
            return self, None
        return (self, "tokens") if identity.digest == self._legacy.digest else None

    def _bounds(self, code_bits: int, trace: TraceColumns, count: int) -> tuple[Bound, ...]:
        bounds = [code_within_table_cost(code_bits, float(sum(trace.cost)))]
        if self._level.spec.reference == "uniform":
            bounds.append(code_within_uniform(code_bits, count, self._vocab))
        return tuple(bounds)

    def encode(self, tokens: Sequence[int], kv: torch.Tensor | None, prefix: Prefix | None,
               dictionary: Dictionary | None) -> EncodedSpan:
        token_list = [int(t) for t in tokens]
        before = list(prefix.tokens) if prefix is not None else []
        tail = token_list[len(before):]
        if not tail or any(not 0 <= t < self._vocab for t in tail):
            raise InvalidTokensError("a span needs at least one token, each inside the "
                                     f"vocabulary of {self._vocab:,}")
        encoder = ArithmeticEncoder()
        trace = TraceColumns(with_entropy=False)
        code_tokens(self._level, self._vocab, before, tail, encoder, trace)
        code = encoder.finish()
        bounds = self._bounds(code.num_bits, trace, len(tail))
        raise_unless_all_hold(bounds)
        session = replace(self._base(), count=len(tail), segments=(len(tail),),
                          tokens_digest=tokens_digest(token_list), token_code=code,
                          kv_scope="tail")
        return EncodedSpan(session, bounds, None, None, True)

    def _base(self) -> CodedSession:
        return CodedSession(
            level=self._level.spec.name, count=0, segments=(), vocab_size=self._vocab,
            model_digest=NO_PROFILE, profile_digest=NO_PROFILE, tokens_digest=NO_PROFILE,
            kv_digest=None, prefix=None, dictionary=None,
            token_code=BitStream(b"", 0), residual=None)

    def decode_many(self, items: Sequence[SpanItem]) -> list[DecodedSpan]:
        results = []
        base = self._base()
        for item in items:
            record = item.record
            before = list(item.prefix.tokens) if item.prefix is not None else []
            if record.count > MODEL_FREE_MAX_TOKENS:
                raise DecodeLimitError(
                    f"a tokens-only span declares {record.count:,} tokens: more than a "
                    f"model-free decode allows ({MODEL_FREE_MAX_TOKENS:,})")
            # a version-3 record's code is the encoder's floored bits (``seqkv.formats.span``)
            guarded = record.code_form == "floored"
            decoder = ArithmeticDecoder(record.token_code, OVERRUN_BITS if guarded else None)
            try:
                check_model_free_decode(self._level, self._vocab, len(before) + record.count,
                                        record.count, record.token_code, guarded, capped=True)
                tokens = before + decode_tokens(self._level, self._vocab, before,
                                                record.count, decoder, TraceColumns(figures=False))
            except CodeExhaustedError as error:
                raise CorruptRecordError(f"a tokens-only span does not decode: {error}") from error
            try:
                verify(session_of(record, self._level, base), tokens, None, 0, False)
            except DecodeVerificationError as error:
                raise StoreVerificationError(f"{error} (a tokens-only span)") from error
            if not (decoder.canonical(floor=True) if guarded else decoder.canonical_bytes()):
                raise CorruptRecordError(
                    "a tokens-only span's token code is not the one its writer writes for the "
                    "tokens it decodes to (bytes appended after it, or bits changed past its "
                    "end): the record was damaged")
            results.append(DecodedSpan(tokens, None))
        return results


__all__ = ["DEFAULT_STORE_LEVEL", "ModelCodec", "TokensCodec", "session_of"]

"""Two ``SessionCodec``s: the store's adapter over ``seqkv.compress``, and a model-free one.

``SkvCodec`` codes a span with ``seqkv.compress`` (any level, the stored prefix as a
``ResolvedPrefix``) and keeps, of the ``.skv`` it returns, only what differs from span
to span: the token count, the token code, the residual section, and one 8-byte digest of the
tokens and KV digests together. The rest of the file (model and profile digests, level,
vocabulary, segment lengths, the prefix reference) is the same for every span of the codec
(stored once, as the codec's identity) or derivable from the chain. To decode, the adapter
rebuilds each span's container and decodes them all together with ``seqkv.decode_containers``
(sessions at the ``rows``, ``segments`` and ``portable`` levels share forwards), checking the
chain's digests: the tokens always, the KV wherever this worker's execution profile can
reproduce it (elsewhere a portable level's KV is returned recomputed, ``kv_exact`` False).

Payload layout (varints as in ``seqkv.store.record``)::

    head       varint   2 * tokens coded + 1 if a residual section follows; at a level that
                        mixes (``portable+mix``): 4 * tokens coded + 2 if a dictionary digest
                        follows + 1 if a residual section follows
    digests    16 bytes the 8-byte digests of the whole chain's tokens and of its KV
    [dict]     32 bytes the SHA-256 digest of the mixing dictionary the span was coded with
    [residual] varint length, then the section as a ``.skv`` file holds it
    code       bytes    the token code (its bit length is not kept: the decoder reads zeros past
                        a stream's end and the last byte's padding is zeros, so decoding
                        8 * bytes bits gives the same symbols)

Invariants:
1. ``decode_many`` returns nothing it has not checked against the digest: the tokens of the whole
   chain and the rebuilt KV (enforced; ``StoreVerificationError``).
2. ``SkvCodec.encode`` reports as ``EncodedSpan.kv`` the KV a decoder rebuilds, which the
   encoder computed and digested (enforced), so the store never codes a child against KV a
   decoder would not rebuild.
3. A span coded with a dictionary decodes only with the dictionary of that digest, from the
   source the store gives (its namespace's); a source without it raises
   ``DictionaryUnavailableError`` with one message whatever other namespaces hold (enforced).
   The mixing levels' identity carries ``"payload": "dictionary"``, so a payload of the layout
   without the dictionary field is never read with it (enforced by the identity's digest).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict

import torch

from seqkv.codec import (
    DEFAULT_TOLERANCE,
    DictionarySource,
    compress,
    decode_containers,
    kv_digest,
    tokens_digest,
)
from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder, BitStream
from seqkv.container import (
    DICTIONARY_DIGEST_BYTES,
    FORMAT_VERSION,
    Container,
    Header,
    PrefixRef,
    decode_container,
    decode_residual_section,
    encode_residual_section,
    split_lengths,
)
from seqkv.digests import DIGEST_BYTES, Digest, model_digest, profile_digest
from seqkv.errors import CorruptFileError, DecodeVerificationError, SeqKVError
from seqkv.levels import CodingLevel, parse_level
from seqkv.levels.base import Distribution
from seqkv.levels.model_free import ModelFreeLevel
from seqkv.mixing.dictionary import Dictionary, DictionaryDigest
from seqkv.mixing.errors import DictionaryError, DictionaryUnavailableError
from seqkv.models.adapter import CausalLM
from seqkv.models.profiles import execution_profile
from seqkv.store.codec import CodecIdentity, DecodedSpan, EncodedSpan, PrefixState
from seqkv.store.errors import CorruptRecordError, StoreVerificationError
from seqkv.store.record import read_varint, write_varint
from seqkv.trie.keys import DEFAULT_NAMESPACE, PrefixHash, prefix_hash
from seqkv.trie.radix import ResolvedPrefix

DEFAULT_STORE_LEVEL = "portable"
"""The level a store codes at unless told otherwise: tokens that decode on any machine."""
_DICTIONARY_BYTES = DICTIONARY_DIGEST_BYTES

# NOTE: the .skv format the records' fields were defined against, part of the codec's identity.
# Format 4 changed nothing a record holds (its flag marks a file without a KV digest, and a
# record always carries one), so stores written under format 3 keep their codec identity.
RECORD_FORMAT = 3


def missing_dictionary(digest: str) -> DictionaryUnavailableError:
    """The error for a span whose dictionary its namespace does not hold: one message, whether
    the digest exists in another namespace or nowhere (the store's tenant rule)."""
    return DictionaryUnavailableError(
        f"a stored span was coded with the mixing dictionary {digest[:16]}..., which its "
        "namespace does not hold: put that dictionary into the namespace again "
        "(SessionStore.put_dictionary; CLI: seqkv store dict-put DICT --namespace NS)")


class _Found:
    """The dictionaries of one ``decode_many`` call, by digest (a ``DictionarySource``)."""

    def __init__(self, found: dict[str, Dictionary]) -> None:
        self._found = found

    def get(self, digest: str) -> Dictionary | None:
        return self._found.get(digest)


def _resolved(prefix: PrefixState | None) -> ResolvedPrefix | None:
    if prefix is None:
        return None
    return ResolvedPrefix(DEFAULT_NAMESPACE, prefix_hash(DEFAULT_NAMESPACE, prefix.tokens),
                          prefix.tokens, (), prefix.kv)


class _Prefixes:
    """The prefixes of one ``decode_many`` call, by hash (a ``seqkv.codec.PrefixSource``)."""

    def __init__(self, prefixes: Sequence[ResolvedPrefix | None]) -> None:
        self._by_hash = {p.prefix_hash: p for p in prefixes if p is not None}

    def resolve(self, prefix_hash: PrefixHash, *, with_kv: bool = True) -> ResolvedPrefix:
        return self._by_hash[prefix_hash]


class SkvCodec:
    """``SessionCodec`` over ``seqkv.compress``: one model, one level, one tolerance."""

    def __init__(self, model: CausalLM, level: CodingLevel | str = DEFAULT_STORE_LEVEL,
                 tolerance: float = DEFAULT_TOLERANCE, report_kv: bool = True) -> None:
        self._model = model
        self._level = parse_level(level) if isinstance(level, str) else level
        self._tolerance = tolerance
        self._report_kv = report_kv
        self._profile = execution_profile(model, self._level.spec.schedule)

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
    def uses_dictionary(self) -> bool:
        return self._level.spec.mixes

    @property
    def max_prefix_error(self) -> float:
        return self._tolerance

    def identity(self) -> CodecIdentity:
        model = self._model
        description: dict[str, object] = {
            "codec": "seqkv.store.skv-adapter", "version": 2, "format": RECORD_FORMAT,
            "model": asdict(model.identity), "profile": asdict(self._profile),
            "level": self._level.spec.name, "tolerance": self._tolerance,
            "vocab_size": model.vocab_size,
        }
        if self.uses_dictionary:
            description["payload"] = "dictionary"
        return CodecIdentity.of(description)

    def encode(self, tokens: Sequence[int], kv: torch.Tensor | None,
               prefix: PrefixState | None) -> EncodedSpan:
        return self.encode_with_dictionary(tokens, kv, prefix, None)

    def encode_with_dictionary(self, tokens: Sequence[int], kv: torch.Tensor | None,
                               prefix: PrefixState | None,
                               dictionary: Dictionary | None) -> EncodedSpan:
        token_list = [int(t) for t in tokens]
        result = compress(self._model, token_list, kv=kv, tolerance=self._tolerance,
                          prefix=_resolved(prefix), level=self._level, dictionary=dictionary,
                          record_kv=True)  # a store's record always carries the KV digest
        container = decode_container(result.data)
        assert container.header.kv_digest is not None, "record_kv=True records the KV"
        residual = (b"" if container.residual is None
                    else encode_residual_section(container.residual))
        out = bytearray()
        count = container.header.count
        named = container.header.dictionary
        if self.uses_dictionary:
            write_varint(out, 4 * count + (2 if named is not None else 0) + (1 if residual else 0))
        else:
            write_varint(out, 2 * count + (1 if residual else 0))
        rebuilt = result.kv
        out += container.header.tokens_digest + container.header.kv_digest
        if named is not None:
            out += bytes.fromhex(named)
        if residual:
            write_varint(out, len(residual))
            out += residual
        out += container.token_code.data
        coded = len(container.token_code.data) + len(residual)
        exact = result.stats.max_abs_kv_error in (None, 0.0)
        return EncodedSpan(bytes(out), container.header.count, coded, len(result.data),
                           rebuilt if self._report_kv else None, exact)

    def payload_dictionary(self, payload: bytes) -> DictionaryDigest | None:
        if not self.uses_dictionary:
            return None
        try:
            head, position = read_varint(payload, 0)
        except ValueError as error:
            raise CorruptRecordError(f"a span payload is malformed: {error}") from error
        if not head & 2:
            return None
        start = position + 2 * DIGEST_BYTES
        named = payload[start : start + _DICTIONARY_BYTES]
        if len(named) != _DICTIONARY_BYTES:
            raise CorruptRecordError("a span payload ends inside its dictionary digest")
        return DictionaryDigest(named.hex())

    def _container(self, payload: bytes, prefix: ResolvedPrefix | None) -> Container:
        try:
            head, position = read_varint(payload, 0)
            named = self.payload_dictionary(payload)
            count = head >> 2 if self.uses_dictionary else head >> 1
            has_residual = head & 1
            tokens_part = Digest(payload[position : position + DIGEST_BYTES])
            kv_part = Digest(payload[position + DIGEST_BYTES : position + 2 * DIGEST_BYTES])
            position += 2 * DIGEST_BYTES + (_DICTIONARY_BYTES if named is not None else 0)
            residual = None
            if has_residual:
                length, position = read_varint(payload, position)
                if position + length > len(payload):
                    raise ValueError("the residual runs past the payload's end")
                residual = decode_residual_section(payload[position : position + length])
                position += length
            data = payload[position:]
            code = BitStream(data, 8 * len(data))
        except (ValueError, IndexError, CorruptFileError) as error:
            raise CorruptRecordError(f"a span payload is malformed: {error}") from error
        if count < 1 or len(kv_part) != DIGEST_BYTES:
            raise CorruptRecordError("a span payload's lengths do not add up")
        spec = self._level.spec
        family, _, parameter = self._level.spec.name.partition(":")
        # Only the segments level splits its tokens (portable:N's parameter is a layer count).
        segments = (tuple(split_lengths(count, int(parameter))) if family == "segments"
                    else (count,))
        header = Header(
            format_version=FORMAT_VERSION, level=spec.name, count=count, segments=segments,
            vocab_size=None if spec.model_coded else self._model.vocab_size,
            model_digest=model_digest(self._model.identity),
            profile_digest=profile_digest(self._profile),
            tokens_digest=tokens_part, kv_digest=kv_part,
            prefix=None if prefix is None or prefix.kv is None else PrefixRef(
                str(prefix.prefix_hash), len(prefix.tokens), kv_digest(prefix.kv)),
            dictionary=named)
        return Container(header, code, residual)

    def decode_many(self, items: Sequence[tuple[bytes, PrefixState | None]]
                    ) -> list[DecodedSpan]:
        return self.decode_many_with_dictionaries(items, _Found({}))

    def decode_many_with_dictionaries(self, items: Sequence[tuple[bytes, PrefixState | None]],
                                      dictionaries: DictionarySource) -> list[DecodedSpan]:
        prefixes = [_resolved(prefix) for _, prefix in items]
        containers = [self._container(payload, prefix)
                      for (payload, _), prefix in zip(items, prefixes, strict=True)]
        found: dict[str, Dictionary] = {}
        for container in containers:
            named = container.header.dictionary
            if named is not None and named not in found:
                dictionary = dictionaries.get(named)
                if dictionary is None:
                    raise missing_dictionary(named)
                found[named] = dictionary
        try:
            decoded = decode_containers(self._model, containers, prefixes=_Prefixes(prefixes),
                                        dictionaries=_Found(found))
        except DecodeVerificationError as error:
            raise StoreVerificationError(
                f"{error}: this worker did not reproduce the encoder's probabilities and KV bit "
                "for bit, or the span was coded against another prefix") from error
        except SeqKVError as error:
            if isinstance(error, StoreVerificationError | DictionaryError):
                raise
            raise CorruptRecordError(f"a span does not decode: {error}") from error
        results = []
        for (_, prefix), result in zip(items, decoded, strict=True):
            skip = len(prefix.tokens) if prefix is not None else 0
            results.append(DecodedSpan(result.tokens[skip:], result.kv, result.kv_exact))
        return results


class PortableTokenCodec:
    """``SessionCodec`` for tokens only, at the ``plain`` or ``ngram`` level: no model, no KV.

    For stores that keep token streams (and for measuring the index at scale without model
    forwards). Payload: ``count`` varint, 8-byte token digest, the code (bit length as in
    ``SkvCodec``).
    """

    def __init__(self, vocab_size: int, level: str = "plain") -> None:
        coding_level = parse_level(level)
        if not isinstance(coding_level, ModelFreeLevel):
            raise ValueError(f"PortableTokenCodec codes at 'plain' or 'ngram', not {level!r}")
        self._level = coding_level
        self._vocab = vocab_size

    @property
    def uses_kv(self) -> bool:
        return False

    @property
    def max_prefix_error(self) -> float:
        return math.inf

    def identity(self) -> CodecIdentity:
        return CodecIdentity.of({"codec": "seqkv.store.portable-tokens", "version": 1,
                                 "level": self._level.spec.name, "vocab_size": self._vocab})

    def _tables(self, before: Sequence[int], tokens: Sequence[int]) -> Iterator[Distribution]:
        return self._level.tables(self._vocab, before, tokens)

    def encode(self, tokens: Sequence[int], kv: torch.Tensor | None,
               prefix: PrefixState | None) -> EncodedSpan:
        token_list = [int(t) for t in tokens]
        before = list(prefix.tokens) if prefix is not None else []
        tail = token_list[len(before):]
        if not tail or any(not 0 <= t < self._vocab for t in tail):
            raise ValueError("a span needs at least one token, each inside the vocabulary")
        encoder = ArithmeticEncoder()
        # NOTE: not ``seqkv.compress``: it also records a per-token trace (an entropy over the
        # whole vocabulary per token), which took 40% of a put at V = 49,152 here.
        tables = self._tables(before, tail)
        for token in tail:
            encoder.encode(next(tables)[0], token)
        code = encoder.finish()
        out = bytearray()
        write_varint(out, len(tail))
        out += tokens_digest(token_list)
        out += code.data
        return EncodedSpan(bytes(out), len(tail), len(code.data), 0, None, True)

    def decode_many(self, items: Sequence[tuple[bytes, PrefixState | None]]
                    ) -> list[DecodedSpan]:
        results = []
        for payload, prefix in items:
            try:
                count, position = read_varint(payload, 0)
                wanted = payload[position : position + DIGEST_BYTES]
                data = payload[position + DIGEST_BYTES :]
                code = BitStream(data, 8 * len(data))
            except ValueError as error:
                raise CorruptRecordError(f"a span payload is malformed: {error}") from error
            before = list(prefix.tokens) if prefix is not None else []
            decoder = ArithmeticDecoder(code)
            tail: list[int] = []
            tables = self._tables(before, tail)
            for _ in range(count):  # as in encode: no per-token trace
                tail.append(decoder.decode(next(tables)[0]))
            if tokens_digest(before + tail) != wanted:
                raise StoreVerificationError("decoded tokens do not match the span's digest")
            results.append(DecodedSpan(tail, None))
        return results


__all__ = ["DEFAULT_STORE_LEVEL", "PortableTokenCodec", "SkvCodec", "missing_dictionary"]

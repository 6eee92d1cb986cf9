"""Two ``SessionCodec``s: the adapter over today's ``seqkv.compress``, and a model-free one.

``SkvCodec`` codes with ``seqkv.compress`` (any level, a ``ResolvedPrefix`` for the prefix) and
keeps, of the ``.skv`` it returns, only the coded sections: the token code, the residual words,
escapes and scales. Everything else in the file's JSON header is either the same for every span
of the codec (model identity, execution profile, level, tolerance, vocabulary: stored once, as the
codec identity) or derivable (segment lengths, KV shape, prefix section), except the two SHA-256
checksums, which shrink to one 8-byte digest of both. That header is the per-session tax the store
does not pay; ``EncodedSpan.container_bytes`` reports what the file would have cost.

Decoding cannot go through ``seqkv.decompress_batch``: that needs the whole header back, and the
header's two full checksums (64 bytes) are the largest part of what a span must not carry. So
``decode_many`` runs the same level decoders ``decompress_batch`` is built from
(``seqkv.levels``: ``new_job``/``decode_rows`` sharing one forward per round among all
``rows``/``segments`` spans, ``decode_portable``, ``recompute_kv``; ``seqkv.codec._start`` for the
``tokens`` level; ``seqkv.coding.residual.decode_residual``). ``tests/test_store_codec.py`` checks
that for every level this gives exactly the tokens and KV ``seqkv.decompress`` gives for the same
file.

Payload layout (varints as in ``seqkv.store.record``)::

    head       varint   3 * tokens coded + residual mode (0 none, 1 quantized, 2 bit-exact)
      words    varint   bytes of residual words          (when residual != 0)
      escapes  varint   number of escaped values         (when residual != 0)
      used     bitmap   one bit per (layer, K/V) group whose scale is non-zero
      scales   f32le    one per used group
    digest     8 bytes  SHA-256(tokens SHA-256 || KV SHA-256)[:8], both of the whole chain
    code       bytes    the token code, ceil(num_bits / 8) bytes (its bit length is not kept: the
                        decoder reads zeros past a stream's end, and the last byte's padding is
                        zeros, so decoding 8 * bytes bits gives the same symbols)
    words, escapes

Invariants:
1. ``decode_many`` returns nothing it has not checked against the digest: the tokens of the whole
   chain and the rebuilt KV, as ``decompress`` checks them against the header (enforced;
   ``StoreVerificationError``).
2. ``SkvCodec.encode`` reports ``EncodedSpan.kv`` only after hashing it to the header's KV
   checksum (enforced), so the store never codes a child against KV a decoder would not rebuild.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from seqkv.codec import DEFAULT_TOLERANCE, _start, compress
from seqkv.coding.arithmetic import ArithmeticDecoder, ArithmeticEncoder, BitStream
from seqkv.coding.frequencies import table_and_log2p
from seqkv.coding.residual import ResidualCode, ResidualMode, decode_residual
from seqkv.container import decode_container
from seqkv.levels import (
    DecodeJob,
    Level,
    LevelChoice,
    _portable_tables,
    decode_portable,
    decode_rows,
    job_tokens,
    new_job,
    recompute_kv,
    split_lengths,
)
from seqkv.models.adapter import CausalLM
from seqkv.models.rows import row_forward
from seqkv.schedule import Schedule, pinned_threads, schedule_threads
from seqkv.store.codec import CodecIdentity, DecodedSpan, EncodedSpan, PrefixState
from seqkv.store.errors import CorruptRecordError, StoreVerificationError
from seqkv.store.record import read_varint, write_varint
from seqkv.trie.keys import DEFAULT_NAMESPACE, prefix_hash
from seqkv.trie.radix import ResolvedPrefix

DIGEST_BYTES = 8
_SCALE = struct.Struct("<f")
_RESIDUAL_MODES = {None: 0, ResidualMode.QUANTIZED: 1, ResidualMode.BIT_EXACT: 2}


def tokens_sha256(tokens: Sequence[int]) -> bytes:
    """SHA-256 of the tokens as little-endian int32, as the ``.skv`` header takes it."""
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).digest()


def kv_sha256(kv: torch.Tensor) -> bytes:
    """SHA-256 of a float32 KV tensor's bytes, as the ``.skv`` header takes it."""
    return hashlib.sha256(np.ascontiguousarray(kv.contiguous().numpy()).data).digest()


def chain_digest(tokens_sha: bytes, kv_sha: bytes) -> bytes:
    return hashlib.sha256(tokens_sha + kv_sha).digest()[:DIGEST_BYTES]


def _resolved(prefix: PrefixState | None) -> ResolvedPrefix | None:
    if prefix is None:
        return None
    return ResolvedPrefix(DEFAULT_NAMESPACE, prefix_hash(DEFAULT_NAMESPACE, prefix.tokens),
                          prefix.tokens, (), prefix.kv)


@dataclass(frozen=True, slots=True)
class _Parsed:
    count: int
    code: BitStream
    residual: int
    words: bytes
    escapes: bytes
    scales: tuple[float, ...]
    digest: bytes


class SkvCodec:
    """``SessionCodec`` over ``seqkv.compress``: one model, one level, one tolerance."""

    def __init__(self, model: CausalLM, level: LevelChoice | str = "rows",
                 tolerance: float = DEFAULT_TOLERANCE, report_kv: bool = True) -> None:
        self._model = model
        self._choice = LevelChoice.parse(level) if isinstance(level, str) else level
        self._tolerance = tolerance
        self._report_kv = report_kv
        self._groups = 2 * model.num_layers

    @property
    def model(self) -> CausalLM:
        return self._model

    @property
    def level(self) -> LevelChoice:
        return self._choice

    @property
    def uses_kv(self) -> bool:
        return True

    @property
    def max_prefix_error(self) -> float:
        return self._tolerance

    @property
    def _schedule(self) -> Schedule:
        return "token-by-token" if self._choice.level == Level.TOKENS else "rows"

    def identity(self) -> CodecIdentity:
        model = self._model
        return CodecIdentity.of({
            "codec": "seqkv.store.skv-adapter", "version": 1,
            "model": asdict(model.identity), "profile": asdict(model.profile(self._schedule)),
            "level": self._choice.name, "tolerance": self._tolerance,
            "vocab_size": model.vocab_size, "first_token_context": model.start_token_id,
            "kv_geometry": [model.num_layers, model.kv_heads, model.head_dim],
        })

    def encode(self, tokens: Sequence[int], kv: torch.Tensor | None,
               prefix: PrefixState | None) -> EncodedSpan:
        token_list = [int(t) for t in tokens]
        resolved = _resolved(prefix)
        result = compress(self._model, token_list, kv=kv, tolerance=self._tolerance,
                          prefix=resolved, level=self._choice)
        container = decode_container(result.data)
        header = container.header
        out = bytearray()
        residual = container.residual
        write_varint(out, 3 * header.tokens.count
                     + _RESIDUAL_MODES[None if residual is None else residual.mode])
        coded = len(container.token_code.data)
        if residual is not None:
            write_varint(out, len(residual.words))
            write_varint(out, residual.num_escapes)
            used = bytearray(math.ceil(len(residual.scales) / 8))
            for group, scale in enumerate(residual.scales):
                if scale != 0.0:
                    used[group // 8] |= 1 << (group % 8)
            out += used
            for scale in residual.scales:
                if scale != 0.0:
                    out += _SCALE.pack(scale)
            coded += math.ceil(residual.num_bits / 8)
        out += chain_digest(bytes.fromhex(header.tokens.sha256), bytes.fromhex(header.kv.sha256))
        out += container.token_code.data
        if residual is not None:
            out += residual.words + residual.escapes
        rebuilt = None
        if self._report_kv and self._choice.level != Level.TOKENS:
            tail = token_list[len(prefix.tokens) if prefix is not None else 0 :]
            with pinned_threads(schedule_threads("rows")):
                recomputed = recompute_kv(row_forward(self._model), tail, resolved)
            candidate = recomputed if residual is None else decode_residual(residual, recomputed)
            if kv_sha256(candidate).hex() == header.kv.sha256:
                rebuilt = candidate
        exact = residual is None or result.stats.max_abs_kv_error == 0.0
        return EncodedSpan(bytes(out), header.tokens.count, coded, len(result.data), rebuilt,
                           exact)

    def _parse(self, payload: bytes) -> _Parsed:
        try:
            head, position = read_varint(payload, 0)
            count, mode = divmod(head, 3)
            words_len = escapes = 0
            scales: tuple[float, ...] = ()
            if mode:
                words_len, position = read_varint(payload, position)
                escapes, position = read_varint(payload, position)
                used = payload[position : position + math.ceil(self._groups / 8)]
                position += len(used)
                values = []
                for group in range(self._groups):
                    if used[group // 8] >> (group % 8) & 1:
                        values.append(_SCALE.unpack_from(payload, position)[0])
                        position += _SCALE.size
                    else:
                        values.append(0.0)
                scales = tuple(values)
            digest = payload[position : position + DIGEST_BYTES]
            position += DIGEST_BYTES
            tail_len = words_len + 4 * escapes
            if tail_len > len(payload) - position:
                raise ValueError("the residual runs past the payload's end")
            end = len(payload) - tail_len
            code = BitStream(payload[position:end], 8 * (end - position))
            words = payload[end : end + words_len]
            rest = payload[end + words_len :]
        except (ValueError, IndexError, struct.error) as error:
            raise CorruptRecordError(f"a span payload is malformed: {error}") from error
        if count < 1 or len(words) != words_len or len(rest) != 4 * escapes:
            raise CorruptRecordError("a span payload's lengths do not add up")
        return _Parsed(count, code, mode, words, rest, scales, digest)

    def decode_many(self, items: Sequence[tuple[bytes, PrefixState | None]]
                    ) -> list[DecodedSpan]:
        parsed = [self._parse(payload) for payload, _ in items]
        prefixes = [_resolved(prefix) for _, prefix in items]
        level = self._choice.level
        model = self._model
        context = model.start_token_id
        tails: list[list[int]] = []
        kvs: list[torch.Tensor | None] = []
        rebuilt: torch.Tensor
        if level == Level.TOKENS:
            for item, prefix in zip(parsed, prefixes, strict=True):
                tail, kv = self._decode_tokens_level(item, prefix)
                tails.append(tail)
                kvs.append(kv)
        elif level.model_coded:
            engine = row_forward(model)
            with pinned_threads(schedule_threads("rows")):
                jobs: list[DecodeJob] = [
                    new_job(engine, ArithmeticDecoder(item.code),
                            split_lengths(item.count, self._choice.segments), context, prefix)
                    for item, prefix in zip(parsed, prefixes, strict=True)]
                decode_rows(engine, jobs)
            for job in jobs:
                tails.append(job_tokens(job)[0])
                kvs.append(job.kv() if len(job.streams) == 1 else None)
        else:
            for item, prefix in zip(parsed, prefixes, strict=True):
                before = list(prefix.tokens) if prefix is not None else []
                tail, _ = decode_portable(level, ArithmeticDecoder(item.code), item.count,
                                          model.vocab_size, before)
                tails.append(tail)
                kvs.append(None)
        results = []
        for item, prefix, tail, kept in zip(parsed, prefixes, tails, kvs, strict=True):
            if kept is None:
                with pinned_threads(schedule_threads("rows")):
                    rebuilt = recompute_kv(row_forward(model), tail, prefix)
            else:
                rebuilt = kept
            if item.residual:
                mode = ResidualMode.QUANTIZED if item.residual == 1 else ResidualMode.BIT_EXACT
                rebuilt = decode_residual(ResidualCode(
                    mode, self._tolerance, tuple(rebuilt.shape), item.scales, item.words,
                    item.escapes), rebuilt)
            chain = (list(prefix.tokens) if prefix is not None else []) + tail
            if chain_digest(tokens_sha256(chain), kv_sha256(rebuilt)) != item.digest:
                raise StoreVerificationError(
                    "a decoded span does not match its digest: this worker did not reproduce "
                    "the encoder's probabilities and KV bit for bit, or the span was coded "
                    "against another prefix"
                )
            results.append(DecodedSpan(tail, rebuilt))
        return results

    def _decode_tokens_level(self, item: _Parsed, prefix: ResolvedPrefix | None
                             ) -> tuple[list[int], torch.Tensor]:
        decoder = ArithmeticDecoder(item.code)
        tail: list[int] = []
        with pinned_threads():
            stepper, table, _ = _start(self._model, self._model.start_token_id, prefix)
            for position in range(item.count):
                token = decoder.decode(table)
                tail.append(token)
                logits = stepper.step(token)
                if position + 1 < item.count:
                    table, _ = table_and_log2p(logits)
        return tail, self._model.kv_tensor(stepper.cache)


class PortableTokenCodec:
    """``SessionCodec`` for tokens only, at the ``plain`` or ``ngram`` level: no model, no KV.

    For stores that keep token streams (and for measuring the index at scale without model
    forwards). Payload: ``count`` varint, 8-byte token digest, the code (bit length as in
    ``SkvCodec``).
    """

    def __init__(self, vocab_size: int, level: str = "plain") -> None:
        self._choice = LevelChoice.parse(level)
        if self._choice.level.model_coded:
            raise ValueError(f"PortableTokenCodec codes at 'plain' or 'ngram', not {level!r}")
        self._vocab = vocab_size

    @property
    def uses_kv(self) -> bool:
        return False

    @property
    def max_prefix_error(self) -> float:
        return math.inf

    def identity(self) -> CodecIdentity:
        return CodecIdentity.of({"codec": "seqkv.store.portable-tokens", "version": 1,
                                 "level": self._choice.name, "vocab_size": self._vocab})

    def encode(self, tokens: Sequence[int], kv: torch.Tensor | None,
               prefix: PrefixState | None) -> EncodedSpan:
        token_list = [int(t) for t in tokens]
        before = list(prefix.tokens) if prefix is not None else []
        tail = token_list[len(before):]
        if not tail or any(not 0 <= t < self._vocab for t in tail):
            raise ValueError("a span needs at least one token, each inside the vocabulary")
        encoder = ArithmeticEncoder()
        # NOTE: not ``encode_portable``: it also records a per-token trace (an entropy over the
        # whole vocabulary per token), which took 40% of a put at V = 49,152 here.
        tables = _portable_tables(self._choice.level, self._vocab, before, tail)
        for token in tail:
            encoder.encode(next(tables)[0], token)
        code = encoder.finish()
        out = bytearray()
        write_varint(out, len(tail))
        out += tokens_sha256(token_list)[:DIGEST_BYTES]
        out += code.data
        return EncodedSpan(bytes(out), len(tail), len(code.data), 0, None, True)

    def decode_many(self, items: Sequence[tuple[bytes, PrefixState | None]]
                    ) -> list[DecodedSpan]:
        results = []
        for payload, prefix in items:
            try:
                count, position = read_varint(payload, 0)
                digest = payload[position : position + DIGEST_BYTES]
                data = payload[position + DIGEST_BYTES :]
                code = BitStream(data, 8 * len(data))
            except ValueError as error:
                raise CorruptRecordError(f"a span payload is malformed: {error}") from error
            before = list(prefix.tokens) if prefix is not None else []
            decoder = ArithmeticDecoder(code)
            tail: list[int] = []
            tables = _portable_tables(self._choice.level, self._vocab, before, tail)
            for _ in range(count):  # as in encode: no per-token trace
                tail.append(decoder.decode(next(tables)[0]))
            if tokens_sha256(before + tail)[:DIGEST_BYTES] != digest:
                raise StoreVerificationError("decoded tokens do not match the span's digest")
            results.append(DecodedSpan(tail, None))
        return results

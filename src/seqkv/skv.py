"""The ``.skv`` file API: a session coded by ``seqkv.codec`` written as a ``.skv`` file, read
back and decoded, and old files upgraded.

The codec makes and decodes values (``seqkv.session.CodedSession``); this module is the one
place that turns them into ``.skv`` bytes and back (``seqkv.formats.skv``, and the JSON-header
formats 1 and 2 through ``seqkv.formats.skv_legacy``), and that resolves the shared prefix a
file names by content hash (``PrefixSource``). The store, layer 2, the warm tier and the
connector keep their own formats and never call this module (``tests/test_layering.py``).

Invariants:
1. ``decompress(model, compress(model, tokens, kv).data)`` returns ``tokens`` and the KV that
   ``CompressResult.kv`` holds, verified against the file's digests (``seqkv.codec`` invariant
   2), or raises (enforced).
2. ``compress`` commits nothing when a bound fails: the codec's bounds and the file's own
   (``seqkv.bounds.file_bytes_accounted``: the file's sections add up to its bytes) (enforced).
3. A file decoded with its model is read, then checked against this machine (model, execution
   profile; ``seqkv.codec.check_decodable``), then its prefix and dictionary resolved, then its
   sizes checked against the caller's limits, all before any forward (enforced; ``seqkv.codec``
   invariant 6). A model-free file's tokens (``decompress_tokens`` without a model) have no
   machine to be checked against: the rest holds for them.
4. ``upgrade`` re-codes nothing: a format-1 or 2 file's session is written as format 4 and
   decodes to the same tokens and KV (enforced; ``tests/test_container.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from seqkv.bounds import Bound, file_bytes_accounted, raise_unless_all_hold
from seqkv.codec import (
    DEFAULT_TOLERANCE,
    CodingTrace,
    DecodeItem,
    DecodeLimits,
    DecompressResult,
    DictionarySource,
    PendingDecode,
    PrefillKV,
    check_decodable,
    decode_prepared,
    decode_prepared_tokens,
    encode,
    level_of,
    prepare_decode,
    resolve_dictionary,
    token_limit,
)
from seqkv.descriptions import Descriptions, DescriptionSource
from seqkv.digests import Digest, model_digest, profile_digest
from seqkv.errors import (
    EnvironmentMismatchError,
    InvalidKVError,
    PrefixMismatchError,
    PrefixUnavailableError,
)
from seqkv.formats.skv import SkvRead, read_skv, write_skv
from seqkv.levels import DEFAULT_LEVEL, CodingLevel
from seqkv.mixing.dictionary import Dictionary
from seqkv.models.adapter import CausalLM
from seqkv.models.profiles import reader_side
from seqkv.progress import ProgressSink
from seqkv.session import CodedSession, Prefix, PrefixHash
from seqkv.types import ExecutionProfile, ModelIdentity


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
    tolerance: float | None  # the residual's, when a KV was given
    # Model forwards the encoder ran (a cached start row counts as one): deterministic per level.
    forwards: int = 0
    # SHA-256 of the integer predictor's keys and values after coding, over the positions a
    # decoder's also holds (``seqkv.levels.portable.compared_positions``): portable levels only.
    # A decode's equals it where Lemma 1 holds for the integer path (``seqkv.checker.lemma1``).
    predictor_digest: str | None = None

    @property
    def bits_per_token(self) -> float:
        return self.code_bits / self.tokens

    @property
    def cross_entropy_bits_per_token(self) -> float:
        return self.cross_entropy_bits / self.tokens

    @property
    def payload_bits_per_token(self) -> float:
        """Token code plus residual code per token position: the payload, framing excluded."""
        return (self.code_bits + self.residual_bits) / self.tokens

    @property
    def file_bits_per_token(self) -> float:
        """Every byte of the file, per coded token position: the headline figure."""
        return 8 * self.file_bytes / self.tokens

    @property
    def fp16_bits_per_token(self) -> int:
        return 16 * self.kv_components_per_token

    @property
    def ratio_vs_fp16(self) -> float:
        """fp16 KV over the whole file, per token position."""
        return self.fp16_bits_per_token / self.file_bits_per_token


@dataclass(frozen=True)
class CompressResult:
    data: bytes
    session: CodedSession
    stats: CompressStats
    trace: CodingTrace
    bounds: tuple[Bound, ...]  # all hold unless compress was told to return violations
    sections: dict[str, int]  # the file's bytes, section by section
    # The full descriptions the file names by digest (keep them: ``seqkv.descriptions``).
    model_identity: ModelIdentity
    profile: ExecutionProfile
    # The KV a decode rebuilds, bit for bit; None for a portable file coded without its KV.
    kv: torch.Tensor | None


class PrefixSource(Protocol):
    """Where a decoder finds shared prefixes by content hash: a ``seqkv.trie.PrefixTrie``."""

    def resolve(self, prefix_hash: PrefixHash, *, with_kv: bool = True) -> Prefix: ...


def compress(
    model: CausalLM,
    tokens: Sequence[int],
    kv: DynamicCache | torch.Tensor | PrefillKV | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    progress: ProgressSink | None = None,
    prefix: Prefix | None = None,
    level: CodingLevel | str = DEFAULT_LEVEL,
    *,
    on_violation: Literal["raise", "return"] = "raise",
    dictionary: Dictionary | None = None,
    record_kv: bool = False,
    reference: npt.NDArray[np.float64] | None = None,
) -> CompressResult:
    """Code ``tokens`` (and the residual of ``kv``, a cache those tokens produced) into .skv bytes.

    With ``prefix`` (a shared prefix resolved from a ``seqkv.trie.PrefixTrie``), the file
    references it by hash and codes only the tokens after it; ``kv`` still covers all tokens.
    ``level`` sets the rate-compute dial (``seqkv.levels``): ``portable`` (default: the
    integer predictor, whose tokens decode on any machine), ``tokens``, ``rows``,
    ``segments:N``, ``ngram``, ``plain``, ``portable+mix`` (with a mixing ``dictionary``,
    ``seqkv.mixing``), or a ``CodingLevel``.

    Without ``kv``, a portable level codes the tokens alone: its coding runs no float model (the
    bounds below still run the float reference) and the file records no KV (its decoder
    recomputes one and reports it unverified, ``kv_exact`` False); ``record_kv=True`` records
    the KV of the ``prefill`` schedule anyway (one float prefill). Every other level records
    the KV it computes while coding. ``kv="prefill"`` stands for the KV of this machine's prefill
    of ``tokens`` (``CausalLM.prefill``) and runs it here, once: the residual's target, the
    level's KV where the level's is that same prefill (no ``prefix``), and the reference bound's
    rows (``seqkv.codec`` invariant 7). The file is the one ``kv=model.prefill(tokens)`` gives.

    Every run evaluates the bounds of ``seqkv.bounds`` on what it coded and raises
    ``BoundViolationError`` when one fails; ``on_violation="return"`` returns the result with its
    failed bounds instead (``seqkv check`` reports them, and passes the ``reference`` it shares
    with the rest of its measurements: see ``seqkv.codec.encode``).

    >>> from seqkv.models import tiny_random_llama
    >>> model = tiny_random_llama()
    >>> result = compress(model, [5, 17, 17, 3])
    >>> decompress(model, result.data).tokens
    [5, 17, 17, 3]
    """
    if prefix is not None and prefix.prefix_hash is None:
        raise InvalidKVError("a .skv file names its prefix by content hash: resolve the prefix "
                             "from a PrefixTrie")
    encoded = encode(model, tokens, kv, tolerance=tolerance, prefix=prefix, level=level,
                     dictionary=dictionary, record_kv=record_kv, progress=progress,
                     reference=reference)
    written = write_skv(encoded.session)
    bounds = (*encoded.bounds, file_bytes_accounted(len(written.data), written.sections))
    if on_violation == "raise":
        raise_unless_all_hold(bounds)
    session = encoded.session
    residual = session.residual
    stats = CompressStats(
        tokens=session.count,
        prefix_tokens=0 if prefix is None else len(prefix.tokens),
        code_bits=session.token_code.num_bits,
        ideal_code_bits=float(encoded.trace.code_cost_bits.sum()),
        cross_entropy_bits=float(encoded.trace.surprisal_bits.sum()),
        residual_bits=encoded.residual_bits,
        residual_escapes=residual.num_escapes if residual is not None else 0,
        file_bytes=len(written.data),
        kv_components_per_token=model.kv_components_per_token,
        encode_seconds=encoded.encode_seconds,
        max_abs_kv_error=encoded.max_abs_kv_error,
        tolerance=encoded.tolerance,
        forwards=encoded.forwards,
        predictor_digest=encoded.predictor_digest,
    )
    return CompressResult(written.data, session, stats, encoded.trace, bounds,
                          written.sections, model.identity, encoded.profile, encoded.kv)


class _FileDescriptions:
    """The descriptions an old file carried, then a registry's (a ``DescriptionSource``)."""

    def __init__(self, read: SkvRead, registry: DescriptionSource | None) -> None:
        self._read = read
        self._registry = registry

    @property
    def root(self) -> object:
        return getattr(self._registry, "root", None)

    def model(self, digest: Digest) -> ModelIdentity | None:
        if self._read.model is not None and model_digest(self._read.model) == digest:
            return self._read.model
        return None if self._registry is None else self._registry.model(digest)

    def profile(self, digest: Digest) -> ExecutionProfile | None:
        if self._read.profile is not None and profile_digest(self._read.profile) == digest:
            return self._read.profile
        return None if self._registry is None else self._registry.profile(digest)


def resolve_prefix(session: CodedSession, prefixes: PrefixSource | None,
                   with_kv: bool = True) -> Prefix | None:
    """The prefix a .skv session names, from ``prefixes``, checked against the reference;
    without ``with_kv`` its tokens only (the tokens digest then vouches for them)."""
    ref = session.prefix
    if ref is None:
        return None
    if prefixes is None:
        raise PrefixUnavailableError(
            f"the file codes only the tokens after a shared prefix of {ref.tokens} tokens "
            f"(hash {ref.prefix_hash[:16]}): pass the PrefixTrie that holds it"
        )
    prefix = prefixes.resolve(PrefixHash(ref.prefix_hash), with_kv=with_kv)
    kv_differs = with_kv and (prefix.kv is None or prefix.kv_digest != ref.kv_digest)
    if len(prefix.tokens) != ref.tokens or kv_differs:
        raise PrefixMismatchError(
            f"the trie's prefix {ref.prefix_hash[:16]} is not the one the file was coded "
            "against: its tokens or KV differ"
        )
    return prefix


def _read_pending(model: CausalLM, data: bytes, prefixes: PrefixSource | None,
                  dictionaries: DictionarySource | None, allow_environment_mismatch: bool,
                  descriptions: DescriptionSource | None, require_exact_kv: bool,
                  limits: DecodeLimits, with_kv: bool = True) -> PendingDecode:
    """A file read, checked against this machine, then its prefix and dictionary resolved."""
    return _checked_pending(model, read_skv(data, reader_side(model)), prefixes, dictionaries,
                            allow_environment_mismatch, descriptions, require_exact_kv, limits,
                            with_kv)


def _checked_pending(model: CausalLM, read: SkvRead, prefixes: PrefixSource | None,
                     dictionaries: DictionarySource | None, allow_environment_mismatch: bool,
                     descriptions: DescriptionSource | None, require_exact_kv: bool,
                     limits: DecodeLimits, with_kv: bool) -> PendingDecode:
    """``_read_pending`` of a file already read (its header parsed once)."""
    session = read.session
    checkable = check_decodable(model, session, allow_environment_mismatch,
                                _FileDescriptions(read, descriptions), require_exact_kv)
    item = DecodeItem(session, resolve_prefix(session, prefixes),
                      resolve_dictionary(session, dictionaries))
    return prepare_decode(model, item, limits, kv_checkable=checkable, with_kv=with_kv)


def decompress(
    model: CausalLM,
    data: bytes,
    allow_environment_mismatch: bool = False,
    progress: ProgressSink | None = None,
    prefixes: PrefixSource | None = None,
    descriptions: DescriptionSource | None = None,
    require_exact_kv: bool = False,
    dictionaries: DictionarySource | None = None,
    max_tokens: int | None = None,
    max_memory_bytes: int | None = None,
) -> DecompressResult:
    """Decode .skv bytes into the exact tokens and KV cache, or raise.

    A file coded after a shared prefix needs ``prefixes``, the trie that holds that prefix.
    ``descriptions`` (a ``seqkv.descriptions.Descriptions`` registry) lets a refusal say which
    fields of the execution profile differ. A file of a portable level decodes on any machine;
    under another execution profile its KV is recomputed and reported with ``kv_exact`` False,
    or refused with ``require_exact_kv``. A file coded with a mixing dictionary needs it from
    ``dictionaries``. A file of more than ``max_tokens`` tokens (default: the model's context),
    or whose decode would hold more than ``max_memory_bytes`` (``decode_memory_bytes``), is
    refused before any forward (``DecodeLimitError``).
    """
    limits = DecodeLimits(max_tokens, max_memory_bytes)
    pending = _read_pending(model, data, prefixes, dictionaries, allow_environment_mismatch,
                            descriptions, require_exact_kv, limits)
    return decode_prepared(model, [pending], progress)[0]


def decompress_batch(
    model: CausalLM,
    files: Sequence[bytes],
    allow_environment_mismatch: bool = False,
    prefixes: PrefixSource | None = None,
    descriptions: DescriptionSource | None = None,
    dictionaries: DictionarySource | None = None,
    max_tokens: int | None = None,
    max_memory_bytes: int | None = None,
) -> list[DecompressResult]:
    """Decode many .skv files together (as ``seqkv.codec.decode_many``): every file is read and
    checked before any decodes (``max_tokens`` and ``max_memory_bytes`` bound each file as in
    ``decompress``); each result is verified as by ``decompress``; the first failure raises."""
    limits = DecodeLimits(max_tokens, max_memory_bytes)
    pendings = [_read_pending(model, data, prefixes, dictionaries, allow_environment_mismatch,
                              descriptions, False, limits) for data in files]
    return decode_prepared(model, pendings)


def decompress_tokens(
    data: bytes,
    model: CausalLM | None = None,
    prefixes: PrefixSource | None = None,
    max_tokens: int | None = None,
    max_memory_bytes: int | None = None,
) -> list[int]:
    """Decode only the tokens (prefix included), verified against the file's checksum.

    Files at the ``ngram`` and ``plain`` levels need no model and decode on any machine; the
    others need ``model`` and a machine that reproduces the encoder's probabilities. A file of
    more than ``max_tokens`` tokens is refused before decoding (default: the model's context;
    without a model, ``MODEL_FREE_MAX_TOKENS``), as is one whose decode would hold more than
    ``max_memory_bytes``.
    """
    limits = DecodeLimits(max_tokens, max_memory_bytes)
    read = read_skv(data, reader_side(model))
    session = read.session
    level = level_of(session)
    if level.spec.model_coded:
        if model is None:
            raise EnvironmentMismatchError(
                f"the file's tokens are coded under the model (level {session.level!r}): pass "
                "the model that coded it"
            )
        # NOTE: the model's checks as ``decompress`` (environment, prefix with its KV, which
        # the float levels step from), but no KV rebuilt: at portable the float prefill that
        # rebuilds it was a third of a 200-token tokens decode, and it runs on the prefill
        # schedule's 2 threads, which stall beside a competing process
        # (benchmarks/decode_under_load.py)
        pending = _checked_pending(model, read, prefixes, None, False, None, False, limits,
                                   with_kv=False)
        return decode_prepared_tokens(model, pending)
    item = DecodeItem(session, resolve_prefix(session, prefixes, with_kv=False))
    return decode_prepared_tokens(None, prepare_decode(
        None, item, DecodeLimits(token_limit(model, limits.max_tokens), limits.max_memory_bytes),
        with_kv=False))


def upgrade(data: bytes, descriptions: Descriptions | None = None,
            model: CausalLM | None = None) -> bytes:
    """A format-1 or 2 file rewritten in format 4, without re-coding anything (format 5 holds
    only a token code written with its floor, which an old writer did not write).

    The token code and the residual are carried over as they are; the digests of the tokens and
    KV are the old checksums truncated, so the rewritten file decodes to the same tokens and KV.
    The old JSON header's model identity and execution profile go to ``descriptions``. Formats 1
    and 2 predate the CPU model and the row block in the profile: when the rest of the old
    profile is this machine's, they are taken as this machine's (the row block needs ``model``
    for a file of the ``rows`` schedule; the checksums still catch a wrong guess); otherwise they
    stay unknown and the decoder will see another profile. A file of format 3, 4 or 5 is returned
    unchanged.
    """
    read = read_skv(data, reader_side(model))
    if read.version not in (1, 2):
        return data
    if descriptions is not None and read.model is not None:
        descriptions.remember(read.model, read.profile)
    return write_skv(read.session).data

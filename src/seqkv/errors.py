"""Every error seqkv raises on bad input, one class per problem.

A decoder never returns wrong tokens or KV silently: each failure below names what is wrong and
what to do about it. The CLI turns any ``SeqKVError`` into one line on stderr and a non-zero exit
status, never a traceback.
"""

from __future__ import annotations


class SeqKVError(Exception):
    """Base class of all errors that seqkv raises on bad input or failed verification."""


class EmptyInputError(SeqKVError, ValueError):
    """The input holds nothing to code (empty text, zero tokens, empty file)."""


class InvalidTokensError(SeqKVError, ValueError):
    """Token ids that the model's vocabulary cannot hold."""


class InvalidKVError(SeqKVError, ValueError):
    """A KV cache whose shape, dtype or length does not fit the tokens and the model."""


class ContainerError(SeqKVError):
    """A .skv file that cannot be read."""


class NotASeqKVFileError(ContainerError):
    """The file does not start with the .skv magic bytes."""


class UnsupportedVersionError(ContainerError):
    """The file's format version is not one this seqkv can read."""


class TruncatedFileError(ContainerError):
    """The file ends before the lengths recorded in its header say it should."""


class CorruptFileError(ContainerError):
    """The file's checksum, header or sections do not match: it was damaged after writing."""


class DecodeLimitError(SeqKVError):
    """A decode would exceed a limit: the caller's ``max_tokens`` or memory budget, or the work a
    model-free decode allows. Raised before any forward; pass a larger limit to decode anyway."""


class CodeExhaustedError(CorruptFileError):
    """A decode read more information than the file's code carries: its token count is forged
    or its code damaged (``seqkv.coding.arithmetic``, the information guard)."""


class ModelMismatchError(SeqKVError):
    """The file was coded with another model (or tokenizer) than the one given to decode it."""


class EnvironmentMismatchError(SeqKVError):
    """The decoder cannot reproduce the encoder's probabilities bit for bit on this machine.

    Token decoding needs the exact probabilities the encoder used; they depend on the computation
    schedule, dtype, device class, CPU kernels and library versions recorded in the file.
    """


class KVNotRecordedError(SeqKVError):
    """Exact KV was required of a file that records none (coded without its KV)."""


class DecodeVerificationError(SeqKVError):
    """Decoding finished but the result does not match the checksums stored at encode time."""


class ModelLoadError(SeqKVError):
    """The model (or the embedded default model) cannot be found or loaded."""


class PrefixUnavailableError(SeqKVError):
    """The file codes only a tail after a shared prefix, and that prefix cannot be had."""


class PrefixMismatchError(SeqKVError):
    """The shared prefix given or resolved is not the one the file was coded against."""


class UnsupportedModelError(SeqKVError, ValueError):
    """The model's architecture is not supported by the requested coding level."""


class InvalidLevelError(SeqKVError, ValueError):
    """A coding level name that does not parse, or a level parameter out of range."""


class InputTooLongError(InvalidTokensError):
    """More tokens (or text) than the model's context holds: refused before any work starts."""


class InvalidToleranceError(SeqKVError, ValueError):
    """A residual tolerance that is negative, NaN, infinite or beyond what float32 can step."""


class UsageError(SeqKVError, ValueError):
    """A command-line argument that is malformed, out of range or contradicts another one."""


class OutputError(SeqKVError):
    """An output file that cannot be written where asked (missing or read-only folder, a
    directory in the way, a name too long, a full disk); nothing was changed."""


class InvalidArgumentTypeError(SeqKVError, TypeError):
    """An argument of the wrong Python type (a bool or str where a number or a name is needed).

    Also a ``TypeError``, which is what Python code reasonably catches for a wrong type.
    """


class InvalidTensorError(SeqKVError, ValueError):
    """A tensor argument whose shape or values do not fit the operation (codes outside their
    range, non-finite rows, a probability row summing to zero, mismatched sizes)."""


class InvalidTensorDtypeError(InvalidTensorError, TypeError):
    """A tensor argument of the wrong dtype (floats where integer codes are needed, or the
    reverse); also a ``TypeError``, as a wrong type is in Python."""


class InvalidConfigError(SeqKVError, ValueError):
    """A component's parameter that is unknown or out of range; the subclasses name the
    component."""


class QuantizerConfigError(InvalidConfigError):
    """A quantizer or quantization kernel parameter (dim, bits, group size, role, window,
    rotation, format, codebook) that is unknown or out of range."""


class IntegerBackendError(InvalidConfigError):
    """A choice of the integer forward's path (``$SEQKV_INTEGER_BACKEND``, ``$SEQKV_INTEGER_ISA``)
    that is unknown, contradicts the other, or names an instruction set this CPU lacks."""


class EnvironmentVariableError(InvalidConfigError):
    """A ``SEQKV_*`` environment variable set to a value seqkv does not accept; the message
    names the variable and the values it accepts (``seqkv.environment``)."""


class EvictionConfigError(InvalidConfigError):
    """An eviction policy name that ``seqkv.eviction.make_policy`` does not know."""


class KernelBackendError(InvalidConfigError):
    """A kernel backend name (argument or ``$SEQKV_KERNELS``) that is not one of the backends."""


class QuantizedDataMismatchError(SeqKVError, ValueError):
    """A quantized tensor or its packed codes handed to a quantizer configured differently from
    the one that produced them (another method, bit width, dim, group size or role)."""


class DeltaConfigError(InvalidConfigError):
    """A delta-coding parameter (predictor, residual quantizer budget, bit allocation,
    surprisal) that is unknown, out of range, inconsistent or missing."""


class CorruptCodeError(SeqKVError, ValueError):
    """A coded payload held in memory (a delta code, its symbol tables) whose parts do not fit
    together: it was damaged or assembled by hand."""


class InsufficientSamplesError(SeqKVError, ValueError):
    """Too few samples, sequences, tokens or positions for the estimate or measurement asked
    for, or a sample argument out of range."""


class ProofInputError(SeqKVError, ValueError):
    """A value given to a symbolic proof or paper-figure check that is out of its domain
    (negative, non-finite, not a distribution, wrong shape)."""


class ProofInputTypeError(ProofInputError, TypeError):
    """A value given to a symbolic proof of a type it cannot take exactly (a bool, a str)."""


class StoreError(SeqKVError):
    """Base class of the session store's errors (``seqkv.store.errors``)."""


class CorruptRecordError(StoreError):
    """A stored record, or the store's metadata about it, fails its checksum or cannot be
    parsed: the storage was damaged."""


class InvalidNameError(SeqKVError, ValueError):
    """A namespace or session id that breaks the length or character rules
    (``seqkv.namespaces``)."""


class WarmTagMismatchError(SeqKVError, ValueError):
    """A warm entry that stands for other tokens (or another cache key) than the ones asked for:
    misfiled or stale. Recompute the KV rather than load it."""


class ConnectorConfigError(InvalidConfigError):
    """A serving-engine connector setting (``kv_connector_extra_config`` key, engine parallelism,
    KV dtype or layout) that seqkv's connector does not support or cannot parse."""

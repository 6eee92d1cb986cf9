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


class ModelMismatchError(SeqKVError):
    """The file was coded with another model (or tokenizer) than the one given to decode it."""


class EnvironmentMismatchError(SeqKVError):
    """The decoder cannot reproduce the encoder's probabilities bit for bit on this machine.

    Token decoding needs the exact probabilities the encoder used; they depend on the computation
    schedule, dtype, device class, CPU kernels and library versions recorded in the file.
    """


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

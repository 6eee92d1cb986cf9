"""The errors of ``seqkv.mixing``: dictionaries that cannot be built, read or used, and mixer
settings out of range."""

from __future__ import annotations

from seqkv.errors import InvalidConfigError, SeqKVError


class DictionaryError(SeqKVError):
    """Base class: a mixing dictionary that cannot be built, read or used."""


class InvalidDictionaryInputError(DictionaryError, ValueError):
    """The sequences or settings given to build a dictionary are not usable."""


class NotADictionaryError(DictionaryError):
    """The bytes do not start with the dictionary magic: this is not a seqkv dictionary."""


class UnsupportedDictionaryVersionError(DictionaryError):
    """The dictionary's format version is not one this seqkv can read."""


class TruncatedDictionaryError(DictionaryError):
    """The bytes end before the lengths in the dictionary's header say they should."""


class CorruptDictionaryError(DictionaryError):
    """The dictionary's digest, lengths or tokens do not agree: it was damaged after writing."""


class DictionaryMismatchError(DictionaryError):
    """The dictionary is not the one the coded data references (digest or vocabulary differ)."""


class DictionaryUnavailableError(DictionaryError):
    """The coded data references a dictionary that was not given."""


class MixerConfigError(InvalidConfigError):
    """A mixer setting (match lengths, share shift, initial weights) out of range, or a
    dictionary index built for other settings than the mixer's."""

"""Every error the prefix trie raises, one class per problem.

All of them derive from ``seqkv.errors.SeqKVError`` through :class:`TrieError`, so the CLI's
one-line error handling covers them. Bad tokens, log-probabilities or KV tensors reuse the codec's
``EmptyInputError``, ``InvalidTokensError`` and ``InvalidKVError``.
"""

from __future__ import annotations

from seqkv.errors import InvalidConfigError, SeqKVError


class TrieError(SeqKVError):
    """Base class of the prefix trie's errors."""


class TrieConfigError(TrieError, InvalidConfigError):
    """A prefix trie or block cache parameter (budget, block size, eviction policy, threshold,
    ``k``, benchmark workload) that is unknown or out of range."""


class InvalidLogProbsError(TrieError, ValueError):
    """Per-token log2-probabilities that are missing, of the wrong length, NaN or positive."""


class InvalidPrefixHashError(TrieError, ValueError):
    """A string that is not a prefix hash (64 lowercase hexadecimal digits)."""


class PrefixNotFoundError(TrieError, LookupError):
    """No node of the trie ends at this prefix: it was never stored, or it has been evicted."""


class PrefixHashMismatchError(TrieError):
    """The tokens the trie holds for a prefix do not hash to the prefix hash they are filed under.

    The trie's memory (or the file it was loaded from) was damaged; nothing is returned.
    """


class UnknownSessionError(TrieError, LookupError):
    """A session id the trie does not hold: never issued, or already released."""


class TrieFileError(TrieError):
    """A saved trie file that cannot be read."""


class NotATrieFileError(TrieFileError):
    """The file does not start with the trie file's magic bytes."""


class UnsupportedTrieVersionError(TrieFileError):
    """The trie file's format version is not one this seqkv can read."""


class TruncatedTrieFileError(TrieFileError):
    """The trie file ends before the lengths recorded in it say it should."""


class CorruptTrieFileError(TrieFileError):
    """The trie file's checksum, header or sections do not match: it was damaged after writing."""


class TrieLimitError(TrieFileError):
    """A well-formed trie file whose tree would cost more to load than its size allows."""


class TrieSnapshotRetiredError(TrieFileError):
    """A trie snapshot (``\\x89SKT``): the format is retired; a store's chain of spans is the
    persistent form of the prefix trie, so re-put the sessions into a store."""

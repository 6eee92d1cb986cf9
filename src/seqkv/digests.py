"""Short digests: how a compact file names its model, its execution profile and its content.

A ``.skv`` file of a few hundred bytes cannot carry a 1.4 KB description of the model and the
profile that coded it. It carries 8-byte digests instead, and the full descriptions live once
where they are needed (a ``DescriptionRegistry`` folder, a store), so that a mismatch can still
be explained field by field when the description is at hand, and named by digest when it is not.

The digests are SHA-256 truncated to 8 bytes (64 bits). A digest is a name and a check against
accidents (another model, another machine, a damaged decode), not a defence against an adversary
crafting collisions: at 2**-64 a random mismatch goes unnoticed once in 1.8e19 comparisons.

Invariants:
1. Each digest is a pure function of its input's canonical form (sorted-key JSON for records,
   little-endian int32 for tokens, raw bytes for tensors) (enforced).
2. This module imports only the standard library and ``seqkv.types`` (enforced by
   ``tests/test_layering.py``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections.abc import Sequence
from dataclasses import asdict
from typing import NewType

from seqkv.types import ExecutionProfile, ModelIdentity

DIGEST_BYTES = 8
Digest = NewType("Digest", bytes)
"""The first ``DIGEST_BYTES`` bytes of a SHA-256."""


# NOTE: the profile digest of a file that records no KV (a portable level coded from the tokens
# alone): its tokens depend on no execution profile, so it names none, and the same tokens give
# the same file on every machine. Readers ignore the profile of a file without a KV digest.
NO_PROFILE = Digest(bytes(DIGEST_BYTES))


def digest(data: bytes | memoryview) -> Digest:
    """The digest of a buffer (hashed in place: a memoryview of a large array is not copied)."""
    return Digest(hashlib.sha256(data).digest()[:DIGEST_BYTES])


def tokens_digest(tokens: Sequence[int]) -> Digest:
    """The digest of token ids as little-endian int32 (ids are below 2**31).

    >>> tokens_digest([5, 17, 17, 3]).hex()
    '9f6154e9c34c08c7'
    """
    values = array("i", tokens)
    if sys.byteorder != "little":
        values.byteswap()
    return digest(memoryview(values).cast("B"))


def model_digest(identity: ModelIdentity) -> Digest:
    """Config, weights and tokenizer: two models with equal digests code and read alike.

    The name is left out (a label, not what computes); the tokenizer is in (the same weights with
    another tokenizer turn the same token ids into other text).
    """
    return digest(json.dumps([identity.config_sha256, identity.weights_sha256,
                              identity.tokenizer_sha256]).encode())


def profile_digest(profile: ExecutionProfile) -> Digest:
    return digest(json.dumps(asdict(profile), sort_keys=True).encode())


def hex_digest(value: bytes) -> str:
    return value.hex()

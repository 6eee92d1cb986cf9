"""The types every layer of seqkv shares, with no dependency beyond the standard library.

A file's header, a store's records, the checker's report and the proofs all speak of the same
few things: which model coded a session (``ModelIdentity``), the shape of its KV cache per token
(``KVGeometry``), and the execution profile a decoder must reproduce (``ExecutionProfile``).
They live here so that reading a file (``seqkv.formats.skv``) or deriving a bound
(``seqkv.proofs``) never imports torch, transformers or the model layer.

Invariants:
1. This module imports nothing from seqkv and nothing outside the standard library (enforced by
   ``tests/test_layering.py``).
2. Every type is a frozen dataclass or a ``NewType``; none holds mutable state (enforced).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, NewType

from seqkv.errors import InvalidArgumentTypeError, InvalidKVError

Sha256Hex = NewType("Sha256Hex", str)
"""64 lowercase hexadecimal digits: a SHA-256 digest."""

Schedule = Literal["token-by-token", "rows", "prefill"]
"""How a level computes the floats it depends on: transformers' forward one token at a time,
seqkv's row-invariant forward (``seqkv.models.rows``), or one float prefill (the KV of levels
whose tokens are coded without float probabilities)."""


@dataclass(frozen=True)
class ModelIdentity:
    """What a .skv file records about the model and tokenizer that coded it."""

    name: str
    config_sha256: str
    weights_sha256: str
    tokenizer_sha256: str | None

    def same_model(self, other: ModelIdentity) -> bool:
        return (self.config_sha256, self.weights_sha256) == (
            other.config_sha256,
            other.weights_sha256,
        )


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """The KV-cache shape of a decoder-only transformer, per token position.

    >>> KVGeometry(layers=30, kv_heads=3, head_dim=64)
    KVGeometry(layers=30, kv_heads=3, head_dim=64)
    """

    layers: int
    kv_heads: int  # key/value heads, not query heads: a GQA model stores fewer than it attends
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentTypeError(f"KVGeometry.{name} must be an int, got {value!r}")
            if value <= 0:
                raise InvalidKVError(f"KVGeometry.{name} must be positive, got {value}")

    @property
    def components_per_token(self) -> int:
        """Keys and values of all layers and heads for one token position."""
        return 2 * self.layers * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class ExecutionProfile:
    """Everything that decides the bits of the logits, as recorded in a .skv file.

    ``seqkv.schedule.current_profile`` measures the profile this process runs under.
    """

    schedule: Schedule
    dtype: str
    device_class: str
    cpu_capability: str
    num_threads: int
    torch_version: str
    transformers_version: str
    # The CPU's vendor, family and model ("" where unknown, as in files of format 1 and 2):
    # kernels choose code paths by CPU model, below what ``cpu_capability`` names.
    cpu_model: str = ""
    # The row-invariant forward's calibrated row block (``rows`` schedule; 0 otherwise).
    row_block: int = 0

    def hard_mismatches(self, other: ExecutionProfile) -> list[str]:
        """Differences that make exact decoding impossible."""
        return _differences(self, other, ("schedule", "dtype", "device_class", "num_threads",
                                          "row_block"))

    def soft_mismatches(self, other: ExecutionProfile) -> list[str]:
        """Differences under which exact decoding is unlikely but can be attempted and verified."""
        return _differences(
            self, other, ("cpu_capability", "cpu_model", "torch_version", "transformers_version")
        )


def _differences(a: ExecutionProfile, b: ExecutionProfile, fields: tuple[str, ...]) -> list[str]:
    left, right = asdict(a), asdict(b)
    return [f"{name}: file has {left[name]!r}, this machine {right[name]!r}"
            for name in fields if left[name] != right[name]]

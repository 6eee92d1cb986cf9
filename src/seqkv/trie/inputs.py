"""Validation of what callers hand the trie: token ids, log2-probabilities and KV tensors.

The trie does not run a model. Callers pass, for each session, its token ids, the model's
log2-probability of each token given the tokens before it (one float per token), and optionally
the KV tensor ``[layers, 2, kv_heads, tokens, head_dim]`` the model produced for those tokens.

Invariants:
1. Token arrays are 1-D int64 with non-negative values (enforced, InvalidTokensError).
2. Log2-probabilities are finite and at most 0; values in (0, 1e-6] (the rounding of a
   log-softmax at a near-certain token) are clamped to 0, larger ones refused (enforced,
   InvalidLogProbsError). So every surprisal is >= 0 and d_T grows with the shared prefix.
3. All KV tensors of one trie share one geometry: layers, kv_heads, head_dim and dtype
   (enforced, InvalidKVError), and cover exactly the session's tokens on axis 3 (enforced).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from seqkv.errors import EmptyInputError, InvalidKVError, InvalidTokensError
from seqkv.trie.errors import InvalidLogProbsError

_CLAMP_ABOVE_ZERO = 1e-6  # log-softmax rounding at a near-certain token; beyond this is an error
_TOKEN_AXIS = 3  # [layers, 2, kv_heads, tokens, head_dim]


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shape and dtype of one token's KV, shared by every KV tensor in a trie.

    (``seqkv.proofs.ratios.KVGeometry`` is the dtype-free geometry the bounds use.)
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return self.layers * 2 * self.kv_heads * self.head_dim * itemsize

    @classmethod
    def of(cls, kv: torch.Tensor) -> KVLayout:
        return cls(layers=kv.shape[0], kv_heads=kv.shape[2], head_dim=kv.shape[4], dtype=kv.dtype)


def as_token_array(
    tokens: Sequence[int] | npt.NDArray[np.integer], *, allow_empty: bool
) -> npt.NDArray[np.int64]:
    """``tokens`` as a fresh 1-D int64 array, or a clear error."""
    try:
        raw = np.asarray(tokens)
    except (OverflowError, ValueError) as error:
        raise InvalidTokensError(f"token ids must be integers in [0, 2^63): {error}") from error
    if raw.size == 0:
        if not allow_empty:
            raise EmptyInputError("the token sequence is empty: a session holds at least one token")
        return np.zeros(0, dtype=np.int64)
    if raw.ndim != 1:
        raise InvalidTokensError(f"token ids must form a 1-D sequence, got shape {raw.shape}")
    if raw.dtype.kind not in "iu":
        raise InvalidTokensError(f"token ids must be integers, got dtype {raw.dtype}")
    if raw.dtype.kind == "u" and raw.dtype.itemsize == 8 and int(raw.max()) >= 2**63:
        raise InvalidTokensError("token ids must be below 2^63")
    if raw.dtype.kind == "i" and int(raw.min()) < 0:
        raise InvalidTokensError(f"token ids must be >= 0, got {int(raw.min())}")
    return raw.astype(np.int64, copy=True)


def as_log2_probs(values: Sequence[float] | npt.NDArray[np.floating], count: int) -> npt.NDArray[
    np.float64
]:
    """Per-token log2-probabilities as a fresh float64 array of ``count`` values, or an error."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise InvalidLogProbsError(f"log2-probabilities must be floats: {error}") from error
    if array.shape != (count,):
        raise InvalidLogProbsError(
            f"expected one log2-probability per token ({count}), got shape {array.shape}"
        )
    if not np.all(np.isfinite(array)):
        raise InvalidLogProbsError(
            "log2-probabilities must be finite: a token of probability 0 cannot have been produced"
        )
    if count and float(array.max()) > _CLAMP_ABOVE_ZERO:
        raise InvalidLogProbsError(
            f"log2-probabilities must be <= 0 (they are log2 P(token | prefix)), got "
            f"{float(array.max())}: pass log2 of probabilities, not surprisals"
        )
    return np.minimum(array, 0.0)


def check_kv(kv: torch.Tensor, count: int, geometry: KVLayout | None) -> torch.Tensor:
    """``kv`` checked against the session's token count and the trie's geometry."""
    if not isinstance(kv, torch.Tensor):
        raise InvalidKVError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
    if kv.dim() != 5 or kv.shape[1] != 2:
        raise InvalidKVError(
            f"kv must be a [layers, 2, kv_heads, tokens, head_dim] tensor, got {tuple(kv.shape)}"
        )
    if not kv.is_floating_point():
        raise InvalidKVError(f"kv must hold floating-point values, got {kv.dtype}")
    if kv.shape[_TOKEN_AXIS] != count:
        raise InvalidKVError(
            f"kv covers {kv.shape[_TOKEN_AXIS]} tokens on axis 3 but the session has {count}: "
            "pass the KV of exactly these tokens"
        )
    if geometry is not None and KVLayout.of(kv) != geometry:
        raise InvalidKVError(
            f"kv has geometry {KVLayout.of(kv)} but this trie holds {geometry}: one trie serves "
            "one model"
        )
    return kv

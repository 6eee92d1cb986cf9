"""A token sequence with the model's log2-probability of each of its tokens.

The unit the clusters, the metric's brute-force checks and the benchmark's workload work on.

Invariants:
1. ``ScoredSequence.of`` validates like ``PrefixTrie.insert`` does (enforced, same functions);
   the plain constructor trusts its caller (assumed: used by the trie and the workload generator
   on arrays they already validated or drew).
2. Tokens and log2-probabilities have one entry per token (enforced by ``of``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from seqkv.trie.inputs import as_log2_probs, as_token_array


@dataclass(frozen=True, slots=True, eq=False)
class ScoredSequence:
    """Tokens and ``log2 P(t_i | t_<i)`` for each; build with :meth:`of` to validate.

    The arrays are owned by this object: callers must not write into them (assumed).
    """

    tokens: npt.NDArray[np.int64]  # [n]
    log2_probs: npt.NDArray[np.float64]  # [n]

    @classmethod
    def of(
        cls,
        tokens: Sequence[int] | npt.NDArray[np.integer],
        log2_probs: Sequence[float] | npt.NDArray[np.floating],
    ) -> ScoredSequence:
        array = as_token_array(tokens, allow_empty=True)
        return cls(tokens=array, log2_probs=as_log2_probs(log2_probs, len(array)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def surprisal_bits(self) -> float:
        """-log2 P_M(sequence) = d_T(s, s)."""
        return float(-np.sum(self.log2_probs)) + 0.0

"""The paper's predictor: the expected next KV vector under the model's top-k token distribution.

Motivation: arXiv 2604.15356 (layer 2) predicts ``KV_i`` as
``KVhat_i = sum_{t in top-k} P(t | t_<i) F(prefix, t) / sum_{t in top-k} P(t | t_<i)``:
the model's own expectation of the next KV vector, renormalised over the ``k`` most likely
tokens (``k ~ 20`` in the paper). ``F(prefix, t)`` is the KV vector the model writes at
position ``i`` when its input there is ``t``.

How it is computed, per position ``i``: one forward of the ``k`` candidates as ``k`` rows of
one sequence at the same position ``i``, over a cache holding the *decoded* prefix, with a 4-D
attention mask that lets each row see the prefix and itself only; so the ``k`` single-token
forwards run batched without copying the prefix ``k`` times. The KV each row wrote is read off
the cache and averaged with the renormalised weights by the kernel op
:func:`seqkv.kernels.topk_expectation`; the KV read off the cache is float32 on the CPU, so its
dispatch runs the torch reference, whose arithmetic is the renormalise-in-float64, sum-in-float32
this predictor always had (``tests/test_kernels_topk_expectation.py`` checks the bits).

The decoder must know ``P(. | t_<i)`` at every position. It can only compute it from the
hidden state of the previous *token*, which the decoded KV does not determine, so this predictor
needs the tokens (the delta coder stores them with seqkv's token codec and counts their bits).
The true token ``t_i`` rides in the same batch as an extra row (or reuses its candidate row when
it is in the top k); its logits give ``P(. | t_<=i)`` for the next position. The first position
uses the distribution after the model's start token (BOS), as the token codec does; a model
without one gets a zero prediction at position 0.

Invariants:
1. Predictions depend on the model, ``k``, the tokens and the decoded prefix only: the cache is
   rebuilt from decoded vectors at every position (enforced by construction).
2. ``cost`` counts every forward: one call per position, ``k`` rows plus one when ``t_i`` is
   not a candidate and a next distribution is needed, plus the start-token call (enforced).
3. The rows of one batch do not see each other: row ``r`` attends to the prefix and itself
   (enforced by the mask; checked by ``tests/test_delta_predictors.py`` against separate
   single-token forwards, to float32 rounding, on a tiny random model of every backbone family
   of ``seqkv.models.backbones``: the candidates ride transformers' own forward, whose custom
   mask and position ids are architecture-neutral, so no family needs code here).
4. ``logits = model(...).logits``, so any logit post-processing of the model is included
   (enforced: the full causal LM runs, with ``logits_to_keep`` limiting the head to one row).

Deviations from the paper: the paper counts the top-k cost as O(k d_model); it is k
single-token forward rows (batched), more than exact recomputation's one row per position,
which the same tokens allow (``exact_recompute``). The per-layer linearisation the paper
mentions is not implemented (it gives no details).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from seqkv.delta.predictors.base import (
    ForwardCost,
    PredictionSession,
    PredictorContext,
    PredictorName,
    SequentialCheck,
    require_tokens,
    zeros_like_position,
)
from seqkv.errors import DeltaConfigError
from seqkv.kernels import topk_expectation
from seqkv.kvcache import cache_from_tensor, with_cache
from seqkv.models.adapter import CausalLM

DEFAULT_K = 20
"""The paper's "k ~ 20"."""


def candidate_mask(prefix: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask ``[1, 1, rows, prefix + rows]``: each row sees the prefix and
    itself.

    >>> candidate_mask(1, 2, torch.float32).eq(0).int().tolist()
    [[[[1, 1, 0], [1, 0, 1]]]]
    """
    mask = torch.full((1, 1, rows, prefix + rows), torch.finfo(dtype).min, dtype=dtype)
    mask[..., :prefix] = 0
    index = torch.arange(rows)
    mask[0, 0, index, prefix + index] = 0
    return mask


@torch.inference_mode()
def forward_candidates(
    model: CausalLM, prefix_kv: torch.Tensor | None, candidates: list[int], keep_row: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``candidates`` as independent single-token continuations of ``prefix_kv``.

    ``prefix_kv`` is ``[layers, 2, kv_heads, P, head_dim]`` (``None``: empty prefix). Returns
    the KV every candidate wrote at position ``P``, ``[layers, 2, kv_heads, rows, head_dim]``,
    and the float32 logits ``[vocab]`` of row ``keep_row`` (``None`` when not asked).
    """
    prefix = 0 if prefix_kv is None else prefix_kv.shape[3]
    rows = len(candidates)
    if prefix_kv is None or prefix == 0:
        cache = DynamicCache()
    else:
        cache = cache_from_tensor(prefix_kv.to(model.device, model.dtype))
    ids = torch.tensor([candidates], dtype=torch.long, device=model.device)  # [1, R]
    positions = torch.full((1, rows), prefix, dtype=torch.long, device=model.device)  # [1, R]
    mask = candidate_mask(prefix, rows, model.dtype).to(model.device)  # [1, 1, R, P + R]
    keep = torch.tensor([0 if keep_row is None else keep_row], device=model.device)
    output = model.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         **with_cache(model.model, cache), use_cache=True, logits_to_keep=keep)
    written = model.kv_tensor(cache)[:, :, :, prefix:, :]  # [L, 2, H, R, D]
    logits = None if keep_row is None else output.logits[0, -1].float().cpu()  # [V]
    return written, logits


@torch.inference_mode()
def start_distribution(model: CausalLM) -> torch.Tensor | None:
    """``P(t_0)``: float64 probabilities after the start token, or ``None`` if it has none."""
    start = model.start_token_id
    if start is None:
        return None
    ids = torch.tensor([[start]], dtype=torch.long, device=model.device)  # [1, 1]
    logits = model.model(input_ids=ids, **with_cache(model.model, DynamicCache()),
                         use_cache=True).logits
    return torch.softmax(logits[0, -1].double().cpu(), dim=-1)


class _TopKSession:
    def __init__(self, context: PredictorContext, k: int) -> None:
        model = context.model
        self._model = model
        self._tokens = list(require_tokens(context, "top-k expectation"))
        if k > model.vocab_size:
            raise DeltaConfigError(f"k={k} exceeds the vocabulary size {model.vocab_size}")
        self._k = k
        self._num_tokens = context.num_tokens
        self._decoded = torch.zeros(model.num_layers, 2, model.kv_heads, context.num_tokens,
                                    model.head_dim)  # [L, 2, H, T, D]
        self._zeros = zeros_like_position(model)
        self._cost = ForwardCost()
        self._probs = start_distribution(model)
        if self._probs is not None:
            self._cost += ForwardCost(1, 1)
        self._check = SequentialCheck()

    def _prefix(self, position: int) -> torch.Tensor | None:
        return self._decoded[:, :, :, :position, :] if position else None  # [L, 2, H, i, D]

    def predict(self, position: int) -> torch.Tensor:
        self._check.predicted(position)
        token = self._tokens[position]
        needs_next = position + 1 < self._num_tokens
        if self._probs is None:
            # No distribution for this position (no start token): predict zero, and run the
            # true token alone for the next position's distribution.
            prediction = self._zeros.clone()
            if needs_next:
                _, logits = forward_candidates(self._model, self._prefix(position), [token], 0)
                self._cost += ForwardCost(1, 1)
                assert logits is not None
                self._probs = torch.softmax(logits.double(), dim=-1)
            return prediction
        top = torch.topk(self._probs, self._k)
        candidates: list[int] = top.indices.tolist()
        rows = list(candidates)
        keep: int | None = None
        if needs_next:
            if token in candidates:
                keep = candidates.index(token)
            else:
                rows.append(token)
                keep = len(rows) - 1
        written, logits = forward_candidates(self._model, self._prefix(position), rows, keep)
        self._cost += ForwardCost(1, len(rows))
        self._probs = None if logits is None else torch.softmax(logits.double(), dim=-1)
        # [k] probabilities shared by every layer and head, [L, 2, H, k, D] -> [L, 2, H, D]
        return topk_expectation(top.values, written[:, :, :, : self._k, :])

    def observe(self, position: int, decoded: torch.Tensor) -> None:
        self._check.observed(position)
        self._decoded[:, :, :, position, :] = decoded

    @property
    def cost(self) -> ForwardCost:
        return self._cost


@dataclass(frozen=True)
class TopKExpectation:
    """``sum_{t in top-k} P(t) F(prefix, t)``, renormalised, over the decoded prefix.

    >>> TopKExpectation(k=20).label
    'top-k (k=20)'
    """

    k: int = DEFAULT_K

    def __post_init__(self) -> None:
        if self.k < 1:
            raise DeltaConfigError(f"k must be positive, got {self.k}")

    @property
    def name(self) -> PredictorName:
        return "topk_expectation"

    @property
    def label(self) -> str:
        return f"top-k (k={self.k})"

    @property
    def needs_tokens(self) -> bool:
        return True

    def start(self, context: PredictorContext) -> PredictionSession:
        return _TopKSession(context, self.k)



"""The model's own entropy rate, by Monte-Carlo sampling from the model.

log2(perplexity) on a data set is a cross-entropy: the cost of coding *that data* with the model.
The paper's H(t_{i+1} | t_<=i) under the model's own distribution is another quantity. We estimate
it by sampling sequences from the model (ancestral sampling after contexts drawn from the data,
a batch of continuations of one context advanced together, one forward per position; or from the
start context alone) and averaging, along each sampled path,
the exact entropy of each next-token distribution: the conditional entropy's Monte-Carlo
estimate with the inner expectation done exactly (lower variance than averaging the surprisal of
the sampled tokens, which is also reported). The target is H(t_1..t_L) / L for sequences of
length L from the start context; it approaches the entropy rate as L grows (the first positions,
with little context, cost more).

Invariants:
1. Sampling uses its own seeded ``torch.Generator``; the global random state is untouched
   (enforced).
2. The interval is a t-interval over independent units: sequences from one start, or the
   contexts' means when continuations share a context (positions within a sequence, and
   sequences of one context, are correlated), so it is honest about that correlation (checked
   on synthetic Markov sources with a known block entropy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from scipy import stats
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from seqkv.checker.estimators import FloatArray, Interval
from seqkv.errors import InsufficientSamplesError
from seqkv.kvcache import with_cache
from seqkv.models.adapter import CausalLM

# The next-token logits of a text's positions: its whole ``[T, V]`` matrix, or the rows one
# estimate needs, by position (``int`` -> ``[V]``).
LogitRows = torch.Tensor | Mapping[int, torch.Tensor]


class SequenceSource(Protocol):
    """Anything that gives next-token log-probabilities for a batch of sequences."""

    vocab_size: int

    def start(self, batch: int) -> torch.Tensor:
        """log-probabilities ``[batch, vocab]`` (natural log) of the first token."""

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens`` ``[batch]``; return next log-probabilities ``[batch, vocab]``."""


class ModelSource:
    """A causal LM as a ``SequenceSource``: batched forward steps on one growing cache."""

    def __init__(self, model: CausalLM) -> None:
        self._model = model
        self.vocab_size = model.vocab_size
        self._cache = DynamicCache()

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self._model.model(input_ids=ids, **with_cache(self._model.model, self._cache)
                                   ).logits[:, -1]  # [B, V]
        return torch.log_softmax(logits.double().cpu(), dim=-1)

    def start(self, batch: int) -> torch.Tensor:
        self._cache = DynamicCache()
        start = self._model.start_token_id
        if start is None:
            return torch.full((batch, self.vocab_size), -float(np.log(self.vocab_size)),
                              dtype=torch.float64)
        return self._forward(torch.full((batch, 1), start, device=self._model.device))

    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._forward(tokens.reshape(-1, 1).to(self._model.device))  # [B, 1]


@dataclass(frozen=True)
class EntropyRateEstimate:
    """Per-sequence averages over sampled sequences, in bits per token."""

    entropy_rate: Interval
    sampled_surprisal: Interval
    per_sequence_entropy: FloatArray
    per_sequence_surprisal: FloatArray
    sequences: int
    length: int


def estimate_entropy_rate(
    source: SequenceSource, sequences: int, length: int, seed: int, confidence: float = 0.95
) -> EntropyRateEstimate:
    """Sample ``sequences`` sequences of ``length`` tokens and estimate the entropy rate."""
    if sequences < 2 or length < 1:
        raise InsufficientSamplesError(
            f"need at least 2 sequences of at least 1 token, got sequences={sequences}, "
            f"length={length}: raise them"
        )
    generator = torch.Generator().manual_seed(seed)
    log_probs = source.start(sequences)  # [B, V], natural log
    entropy = torch.zeros(sequences, dtype=torch.float64)
    surprisal = torch.zeros(sequences, dtype=torch.float64)
    for position in range(length):
        probs = log_probs.exp()
        entropy -= (probs * log_probs).nan_to_num().sum(dim=1)
        tokens = torch.multinomial(probs, 1, generator=generator).reshape(-1)  # [B]
        surprisal -= log_probs.gather(1, tokens[:, None]).reshape(-1)
        if position + 1 < length:
            log_probs = source.advance(tokens)
    per_entropy = (entropy / length / np.log(2)).numpy()
    per_surprisal = (surprisal / length / np.log(2)).numpy()
    return EntropyRateEstimate(
        entropy_rate=_t_interval(per_entropy, confidence, "exact entropy along sampled paths"),
        sampled_surprisal=_t_interval(per_surprisal, confidence, "surprisal of sampled tokens"),
        per_sequence_entropy=per_entropy,
        per_sequence_surprisal=per_surprisal,
        sequences=sequences,
        length=length,
    )


def _t_interval(values: FloatArray, confidence: float, what: str) -> Interval:
    mean = float(values.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, values.size - 1) * values.std(ddof=1)
                 / np.sqrt(values.size))
    return Interval(mean, mean - half, mean + half, confidence,
                    f"{what}: mean over {values.size} independent units, t-interval")


class _ReservedLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A cache layer whose keys and values live in buffers reserved for ``capacity`` positions:
    a step writes its row in place. ``DynamicLayer`` concatenates, copying the whole cache at
    every step: for padded contexts (up to ``BATCH_CACHE_BYTES``) that copy, not the forward,
    was most of an entropy-rate estimate (measured: ``benchmarks/check_cost.py``)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """``keys`` and ``values`` ``[B, H, capacity, D]``: buffers whose first ``length``
        positions are filled (the layer writes into them; it does not copy them)."""
        super().__init__()  # type: ignore[no-untyped-call]
        self._keys = keys
        self._values = values
        self._length = length
        self.device = keys.device
        self.is_initialized = True
        self._expose()

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self._length]
        self.values = self._values[:, :, : self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            raise InsufficientSamplesError(  # a programming error: the capacity is the length
                f"the reserved cache holds {self._keys.shape[-2]} positions, not {end}")
        self._keys[:, :, self._length : end] = key_states
        self._values[:, :, self._length : end] = value_states
        self._length = end
        self._expose()
        assert self.keys is not None and self.values is not None
        return self.keys, self.values


class PaddedContexts:
    """Several contexts of one text as one ``SequenceSource``: their KV slices left-padded into
    one batched cache, ``per_context`` rows each, advanced together (one forward per step for
    all of them). A padded position is masked out, and every row keeps its own positions, so a
    row computes what its context alone would, up to float noise of the batch shape (this is a
    Monte-Carlo estimate, not a coder)."""

    def __init__(self, model: CausalLM, kv: torch.Tensor, logits: LogitRows,
                 ends: Sequence[int], per_context: int, steps: int) -> None:
        self._model = model
        self.vocab_size = model.vocab_size
        self._kv = kv  # [L, 2, H, T, D]: the whole text's, contexts are its first ``end`` rows
        self._logits = logits  # row i ([V]) follows the first i + 1 positions
        self._ends = list(ends)
        self._per = per_context
        self._steps = steps  # positions each row grows by: the reserved capacity
        self._cache: Cache = DynamicCache()
        self._mask = torch.zeros(0)
        self._positions = torch.zeros(0)

    def start(self, batch: int) -> torch.Tensor:
        assert batch == len(self._ends) * self._per, "one batch row per continuation"
        longest = max(self._ends)
        layers, _, heads, _, dim = self._kv.shape
        device, dtype = self._model.device, self._model.dtype
        # [L, 2, B, H, longest + steps, D]: each row's context right-aligned at ``longest``,
        # then room for the sampled steps (``_ReservedLayer``)
        padded = torch.zeros(layers, 2, batch, heads, longest + self._steps, dim, dtype=dtype,
                             device=device)
        mask = torch.zeros(batch, longest, dtype=torch.long, device=device)
        for index, end in enumerate(self._ends):
            rows = slice(index * self._per, (index + 1) * self._per)
            # [L, 2, H, end, D] -> the rows' right-aligned slots
            padded[:, :, rows, :, longest - end : longest] = self._kv[:, :, None, :, :end].to(
                device, dtype)
            mask[rows, longest - end :] = 1
        self._cache = Cache(layers=[_ReservedLayer(padded[layer, 0], padded[layer, 1], longest)
                                    for layer in range(layers)])
        self._mask = mask
        self._positions = torch.tensor([end for end in self._ends for _ in range(self._per)],
                                       device=device)[:, None]  # [B, 1]
        first = torch.log_softmax(torch.stack([self._logits[end - 1] for end in self._ends])
                                  .double().cpu(), dim=-1)  # [contexts, V]
        return first.repeat_interleave(self._per, dim=0).clone()

    @torch.inference_mode()
    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens.reshape(-1, 1).to(self._model.device)  # [B, 1]
        self._mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=1)
        logits = self._model.model(input_ids=ids, **with_cache(self._model.model, self._cache),
                                   attention_mask=self._mask,
                                   position_ids=self._positions).logits[:, -1]  # [B, V]
        self._positions = self._positions + 1
        return torch.log_softmax(logits.double().cpu(), dim=-1)


# NOTE: contexts advanced together per batch, bounded by the padded cache's bytes: 16 rows of a
# 2,000-token SmolLM2-135M cache hold 1.5 GB; at 8,192 tokens fewer contexts share a batch.
BATCH_CACHE_BYTES = 1_600_000_000


def context_ends(positions: int, contexts: int, seed: int) -> list[int]:
    """The context lengths ``estimate_entropy_rate_from_data`` draws from a text of
    ``positions`` tokens (seeded; each context's next-token row is logit row ``end - 1``)."""
    if contexts < 2 or positions < 2:
        raise InsufficientSamplesError("need at least 2 contexts and 2 tokens")
    rng = np.random.default_rng(seed)
    count = min(contexts, positions)
    return sorted(int(i) for i in rng.choice(np.arange(1, positions + 1), size=count,
                                             replace=False))


@torch.inference_mode()
def estimate_entropy_rate_from_data(
    model: CausalLM, kv: torch.Tensor, logits: LogitRows, contexts: int,
    sequences: int, length: int, seed: int, confidence: float = 0.95,
) -> EntropyRateEstimate:
    """The model's entropy rate after ``contexts`` prefixes drawn from a text (seeded):
    ``sequences`` continuations of ``length`` tokens each; the interval is over the contexts.

    ``kv`` ``[L, 2, H, T, D]`` and ``logits`` (``[T, V]``, or the rows ``end - 1`` of the
    ``context_ends`` alone, by index) are of one prefill of the text, shared with the rest of
    the check: a context is the first ``end`` positions.
    Contexts of similar lengths are advanced together, in batches bounded by
    ``BATCH_CACHE_BYTES``.
    """
    positions = kv.shape[3]
    ends = context_ends(positions, contexts, seed)
    per_row = kv[:, :, :, :1].numel() * kv.element_size()
    runs: list[EntropyRateEstimate] = []
    group: list[int] = []
    for end in [*ends, None]:
        if end is not None and (not group or (len(group) + 1) * sequences * end * per_row
                                <= BATCH_CACHE_BYTES):
            group.append(end)
            continue
        source = PaddedContexts(model, kv, logits, group, sequences, length)
        run = estimate_entropy_rate(source, len(group) * sequences, length, seed + len(runs),
                                    confidence)
        for index in range(len(group)):
            rows = slice(index * sequences, (index + 1) * sequences)
            runs.append(_slice(run, rows))
        group = [] if end is None else [end]
    return EntropyRateEstimate(
        entropy_rate=_t_interval(np.array([r.per_sequence_entropy.mean() for r in runs]),
                                 confidence, "exact entropy along sampled paths, per context"),
        sampled_surprisal=_t_interval(np.array([r.per_sequence_surprisal.mean() for r in runs]),
                                      confidence, "surprisal of sampled tokens, per context"),
        per_sequence_entropy=np.concatenate([r.per_sequence_entropy for r in runs]),
        per_sequence_surprisal=np.concatenate([r.per_sequence_surprisal for r in runs]),
        sequences=sum(r.sequences for r in runs),
        length=length,
    )


def _slice(run: EntropyRateEstimate, rows: slice) -> EntropyRateEstimate:
    """One context's continuations of a batched run."""
    entropy, surprisal = run.per_sequence_entropy[rows], run.per_sequence_surprisal[rows]
    return EntropyRateEstimate(run.entropy_rate, run.sampled_surprisal, entropy, surprisal,
                               entropy.size, run.length)

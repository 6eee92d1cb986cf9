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

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from scipy import stats
from transformers import DynamicCache

from seqkv.checker.estimators import FloatArray, Interval
from seqkv.errors import InsufficientSamplesError
from seqkv.kvcache import cache_from_tensor
from seqkv.models.adapter import CausalLM


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
        logits = self._model.model(input_ids=ids, cache=self._cache).logits[:, -1]  # [B, V]
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


class ContextSource:
    """A causal LM continuing one context: batched forward steps on copies of its KV."""

    def __init__(self, model: CausalLM, context_kv: torch.Tensor,
                 next_log_probs: torch.Tensor) -> None:
        self._model = model
        self.vocab_size = model.vocab_size
        self._kv = context_kv  # [L, 2, H, T, D]
        self._first = next_log_probs  # [V], natural log, after the context
        self._cache = DynamicCache()

    def start(self, batch: int) -> torch.Tensor:
        self._cache = cache_from_tensor(self._kv.to(self._model.device, self._model.dtype),
                                        batch)
        return self._first.expand(batch, -1).clone()

    @torch.inference_mode()
    def advance(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens.reshape(-1, 1).to(self._model.device)  # [B, 1]
        logits = self._model.model(input_ids=ids, cache=self._cache).logits[:, -1]  # [B, V]
        return torch.log_softmax(logits.double().cpu(), dim=-1)


@torch.inference_mode()
def estimate_entropy_rate_from_data(
    model: CausalLM, tokens: list[int], contexts: int, sequences: int, length: int, seed: int,
    confidence: float = 0.95,
) -> EntropyRateEstimate:
    """The model's entropy rate after ``contexts`` prefixes drawn from ``tokens`` (seeded):
    ``sequences`` continuations of ``length`` tokens each; the interval is over the contexts."""
    if contexts < 2 or len(tokens) < 2:
        raise InsufficientSamplesError("need at least 2 contexts and 2 tokens")
    cache = DynamicCache()
    ids = torch.tensor([tokens], device=model.device)  # [1, T]
    logits = model.model(input_ids=ids, cache=cache, use_cache=True).logits[0]  # [T, V]
    log_probs = torch.log_softmax(logits.double().cpu(), dim=-1)  # [T, V]
    kv = model.kv_tensor(cache)  # [L, 2, H, T, D]
    rng = np.random.default_rng(seed)
    count = min(contexts, len(tokens))
    chosen = sorted(int(i) for i in rng.choice(np.arange(1, len(tokens) + 1), size=count,
                                               replace=False))
    runs = [estimate_entropy_rate(ContextSource(model, kv[:, :, :, :i], log_probs[i - 1]),
                                  sequences, length, seed + j, confidence)
            for j, i in enumerate(chosen)]
    per_entropy = np.concatenate([r.per_sequence_entropy for r in runs])
    per_surprisal = np.concatenate([r.per_sequence_surprisal for r in runs])
    return EntropyRateEstimate(
        entropy_rate=_t_interval(np.array([r.per_sequence_entropy.mean() for r in runs]),
                                 confidence, "exact entropy along sampled paths, per context"),
        sampled_surprisal=_t_interval(np.array([r.per_sequence_surprisal.mean() for r in runs]),
                                      confidence, "surprisal of sampled tokens, per context"),
        per_sequence_entropy=per_entropy,
        per_sequence_surprisal=per_surprisal,
        sequences=len(per_entropy),
        length=length,
    )

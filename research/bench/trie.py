"""``python -m research.bench trie``: a generated multi-session workload, the trie against
vLLM-style blocks.

Motivation: the trie's value depends on the traffic, so the benchmark states its traffic. No model
runs: tokens are drawn uniformly from a 49,152-token vocabulary (SmolLM2's size) and each token's
log2-probability from a stated law; KV bytes are accounted at fp16 for SmolLM2-135M's geometry
(30 layers x 2 x 3 KV heads x 64 dims = 11,520 components, 2 bytes each: 23,040 bytes per token).

The workload (``WorkloadSpec``; every draw comes from one ``numpy`` generator seeded by ``seed``):

- ``system_prompts`` system prompts of length uniform in ``system_prompt_tokens``, chosen per
  session with Zipf popularity (weight of the k-th most popular: ``k ** -zipf_exponent``);
- for each system prompt, ``few_shot_blocks`` few-shot blocks of length uniform in
  ``few_shot_tokens``; a session includes one with probability ``few_shot_probability``
  (uniformly chosen among its prompt's blocks);
- ``documents`` documents of length uniform in ``document_tokens``, with Zipf popularity; a
  session asks about one with probability ``document_probability`` (after the prompt and shots);
- a unique tail (the question) of length uniform in ``tail_tokens``;
- with probability ``follow_up_probability`` a session is instead a follow-up turn: a uniformly
  chosen one of the last ``follow_up_window`` sessions, whole, plus a new unique tail.
- Per-token surprisal ``-log2 P(t | prefix)`` ~ Gamma(shape ``surprisal_shape``, mean
  ``mean_surprisal_bits``), drawn once per segment, so equal prefixes carry equal values.
- Sessions arrive in order; ``concurrent_sessions`` of them are live (locked) at once, the oldest
  released when a new one arrives.

Figures: storage with no budget (bytes stored over bytes without sharing, for the trie and for
hashed blocks of 16 tokens, whole blocks counted), the paper's corollary ``1 - f (1 - l/n)`` from
the clusters at ``cluster_threshold_bits`` (``seqkv.trie.clusters``) against the measured ratio,
hit rates at a budget of ``budget_fraction`` of the no-budget trie's bytes (trie with LRU and
with the probability-weighted policy, hashed blocks with their LRU free queue), and insert and
match throughput in tokens per second (wall clock, no budget, this machine).

Hashed blocks end up holding slightly fewer bytes than the trie: a released session's partial
last block carries no hash and goes back to the pool, while the trie keeps every token of every
session; a follow-up turn reuses those tails, which is part of the trie's higher hit rate.

Invariants:
1. The same ``seed`` and spec give the same workload and the same non-timing figures (checked).
2. Hit rate = tokens found stored at admission over tokens admitted, the same definition for both
   providers (enforced: both count what their admission call found).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from research.bench.hashed_blocks import VLLM_BLOCK_SIZE, BlockSessionId, HashedBlockCache
from seqkv.eviction import EvictionPolicyName
from seqkv.trie.clusters import cluster_sessions
from seqkv.trie.errors import TrieConfigError
from seqkv.trie.keys import SessionId
from seqkv.trie.radix import PrefixTrie
from seqkv.trie.sequence import ScoredSequence

S = TypeVar("S")  # a provider's session handle

_POLICIES: tuple[EvictionPolicyName, ...] = ("lru", "probability")
SMOLLM2_KV_COMPONENTS_PER_TOKEN = 11_520  # 30 layers x 2 (K, V) x 3 KV heads x 64 dims
FP16_BYTES = 2


@dataclass(frozen=True)
class WorkloadSpec:
    """The generated traffic; defaults keep one run to a few seconds on two cores."""

    sessions: int = 1_000
    vocab_size: int = 49_152  # SmolLM2's vocabulary
    system_prompts: int = 4
    system_prompt_tokens: tuple[int, int] = (200, 800)
    zipf_exponent: float = 1.1  # popularity of system prompts and documents
    few_shot_blocks: int = 3  # per system prompt
    few_shot_tokens: tuple[int, int] = (100, 400)
    few_shot_probability: float = 0.5
    documents: int = 24
    document_tokens: tuple[int, int] = (400, 2_000)
    document_probability: float = 0.4
    tail_tokens: tuple[int, int] = (16, 256)
    follow_up_probability: float = 0.25
    follow_up_window: int = 32
    mean_surprisal_bits: float = 4.0  # log2 perplexity ~ 16: English text under a small LM
    surprisal_shape: float = 0.6  # Gamma shape < 1: many near-certain tokens, a heavy tail
    concurrent_sessions: int = 16
    budget_fraction: float = 0.25  # of the no-budget trie's bytes
    block_size: int = VLLM_BLOCK_SIZE
    bytes_per_token: int = SMOLLM2_KV_COMPONENTS_PER_TOKEN * FP16_BYTES
    cluster_threshold_bits: float = 32.0  # ~ 8 tokens at the mean surprisal

    def __post_init__(self) -> None:
        ranges = (self.system_prompt_tokens, self.few_shot_tokens, self.document_tokens,
                  self.tail_tokens)
        if self.sessions < 1 or any(not 1 <= low <= high for low, high in ranges):
            raise TrieConfigError("sessions must be >= 1 and every length range 1 <= low <= high")
        if not 0 < self.budget_fraction <= 1:
            raise TrieConfigError(f"budget_fraction must lie in (0, 1], got {self.budget_fraction}")


@dataclass(frozen=True)
class TrieBenchResult:
    """Every figure of one run; ``to_json_dict`` is what ``python -m research.bench trie --json``
    prints."""

    seed: int
    sessions: int
    tokens: int
    bytes_naive: int  # every session's KV stored on its own
    bytes_trie: int  # KV the trie holds after all sessions, no budget
    bytes_hashed_blocks: int  # whole blocks held (referenced or cached) after all sessions
    budget_bytes: int  # budget_fraction x bytes_trie, the same for every provider
    hit_rate: float  # trie, LRU, at the budget
    hit_rate_probability_weighted: float  # trie, probability-weighted policy, at the budget
    hit_rate_hashed_blocks: float  # hashed blocks, LRU free queue, at the budget
    hit_rate_unbounded: float  # trie, no budget: the workload's sharing ceiling
    hit_rate_hashed_blocks_unbounded: float
    # The fewest bytes of whole blocks with which hashed blocks hit at least as often as the
    # trie (LRU) at ``budget_bytes``: bytes compared at equal hit rate, under one retention
    # policy (both evict least recently used under a byte budget; the unbounded figures above
    # differ in retention: blocks free a finished session's partial block, the trie keeps it).
    bytes_hashed_blocks_at_trie_hit_rate: int
    storage_predicted: float  # the paper's 1 - f (1 - l/n), clusters at the threshold
    storage_predicted_with_prefix: float  # plus each cluster's shared prefix once
    storage_measured: float  # bytes_trie / bytes_naive
    storage_measured_clusters: float  # what the clusters store / bytes_naive
    storage_measured_hashed_blocks: float  # bytes_hashed_blocks / bytes_naive
    cluster_threshold_bits: float
    clusters: int
    clustered_fraction: float  # f
    mean_tail_tokens: float  # l
    mean_session_tokens: float  # n
    trie_nodes: int
    insert_tokens_per_second: float
    match_tokens_per_second: float
    insert_tokens_per_second_hashed_blocks: float
    match_tokens_per_second_hashed_blocks: float
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)

    def to_json_dict(self) -> dict[str, object]:
        figures: dict[str, object] = {
            k: v for k, v in asdict(self).items() if k != "workload"
        }
        workload: dict[str, object] = dict(asdict(self.workload))
        workload["distribution"] = _DISTRIBUTION
        figures["workload"] = workload
        return figures


_DISTRIBUTION = (
    "system prompt (Zipf popularity, uniform length) + optional few-shot block of that prompt + "
    "optional document (Zipf popularity, uniform length) + unique tail (uniform length); or a "
    "follow-up: a recent session whole + unique tail. Tokens uniform over the vocabulary; "
    "surprisal per token Gamma(shape, mean) bits, fixed per segment."
)


def generate_workload(spec: WorkloadSpec, seed: int) -> tuple[ScoredSequence, ...]:
    """The sessions of one run, in arrival order (module docstring)."""
    rng = np.random.default_rng(seed)

    def segment(bounds: tuple[int, int]) -> ScoredSequence:
        length = int(rng.integers(bounds[0], bounds[1] + 1))
        tokens = rng.integers(0, spec.vocab_size, size=length, dtype=np.int64)
        scale = spec.mean_surprisal_bits / spec.surprisal_shape
        return ScoredSequence(tokens=tokens,
                              log2_probs=-rng.gamma(spec.surprisal_shape, scale, size=length))

    prompts = [segment(spec.system_prompt_tokens) for _ in range(spec.system_prompts)]
    shots = [[segment(spec.few_shot_tokens) for _ in range(spec.few_shot_blocks)]
             for _ in prompts]
    documents = [segment(spec.document_tokens) for _ in range(spec.documents)]
    prompt_weights = _zipf(len(prompts), spec.zipf_exponent)
    document_weights = _zipf(len(documents), spec.zipf_exponent)
    sessions: list[ScoredSequence] = []
    for _ in range(spec.sessions):
        if sessions and rng.random() < spec.follow_up_probability:
            recent = sessions[-spec.follow_up_window :]
            parts = [recent[int(rng.integers(len(recent)))]]
        else:
            prompt = int(rng.choice(len(prompts), p=prompt_weights))
            parts = [prompts[prompt]]
            if rng.random() < spec.few_shot_probability:
                parts.append(shots[prompt][int(rng.integers(len(shots[prompt])))])
            if rng.random() < spec.document_probability:
                parts.append(documents[int(rng.choice(len(documents), p=document_weights))])
        parts.append(segment(spec.tail_tokens))
        sessions.append(ScoredSequence(
            tokens=np.concatenate([p.tokens for p in parts]),
            log2_probs=np.concatenate([p.log2_probs for p in parts]),
        ))
    return tuple(sessions)


def run_trie_bench(seed: int = 0, spec: WorkloadSpec | None = None) -> TrieBenchResult:
    """Generate the workload, run both providers, and return every figure.

    >>> result = run_trie_bench(0, WorkloadSpec(sessions=40))
    >>> result.sessions, result.bytes_trie < result.bytes_naive
    (40, True)
    """
    spec = WorkloadSpec() if spec is None else spec
    sessions = generate_workload(spec, seed)
    tokens = sum(len(s) for s in sessions)
    window = spec.concurrent_sessions

    trie = PrefixTrie(nominal_kv_bytes_per_token=spec.bytes_per_token)
    trie_hits, insert_seconds = _admit_all(sessions, window, _trie_admit(trie), trie.release)
    bytes_trie = trie.sizes().total_bytes
    match_seconds = _timed(lambda: [trie.match(s.tokens, with_kv=False) for s in sessions])

    blocks = HashedBlockCache(block_size=spec.block_size, bytes_per_token=spec.bytes_per_token)
    block_hits, block_insert_seconds = _admit_all(
        sessions, window, _block_admit(blocks), blocks.release)
    bytes_blocks = blocks.stats().bytes_stored
    block_match_seconds = _timed(lambda: [blocks.match(s.tokens) for s in sessions])

    budget = int(spec.budget_fraction * bytes_trie)
    budgeted: dict[EvictionPolicyName, int] = {}
    for policy in _POLICIES:
        bounded = PrefixTrie(budget_bytes=budget, policy=policy,
                             nominal_kv_bytes_per_token=spec.bytes_per_token)
        budgeted[policy] = _admit_all(sessions, window, _trie_admit(bounded), bounded.release)[0]
    bounded_blocks = HashedBlockCache.with_budget(
        budget, bytes_per_token=spec.bytes_per_token, block_size=spec.block_size)
    block_budget_hits = _admit_all(
        sessions, window, _block_admit(bounded_blocks), bounded_blocks.release)[0]

    blocks_at_trie_rate = _blocks_budget_for(budgeted["lru"], sessions, window, spec, budget)

    report = cluster_sessions(sessions, spec.cluster_threshold_bits)
    naive = tokens * spec.bytes_per_token
    return TrieBenchResult(
        seed=seed, sessions=len(sessions), tokens=tokens, bytes_naive=naive,
        bytes_trie=bytes_trie, bytes_hashed_blocks=bytes_blocks, budget_bytes=budget,
        hit_rate=budgeted["lru"] / tokens,
        hit_rate_probability_weighted=budgeted["probability"] / tokens,
        hit_rate_hashed_blocks=block_budget_hits / tokens,
        hit_rate_unbounded=trie_hits / tokens,
        hit_rate_hashed_blocks_unbounded=block_hits / tokens,
        bytes_hashed_blocks_at_trie_hit_rate=blocks_at_trie_rate,
        storage_predicted=report.storage_predicted,
        storage_predicted_with_prefix=report.storage_predicted_with_prefix,
        storage_measured=bytes_trie / naive,
        storage_measured_clusters=report.storage_measured,
        storage_measured_hashed_blocks=bytes_blocks / naive,
        cluster_threshold_bits=spec.cluster_threshold_bits, clusters=len(report.clusters),
        clustered_fraction=report.clustered_fraction, mean_tail_tokens=report.mean_tail_length,
        mean_session_tokens=report.mean_length, trie_nodes=trie.sizes().nodes,
        insert_tokens_per_second=tokens / insert_seconds,
        match_tokens_per_second=tokens / match_seconds,
        insert_tokens_per_second_hashed_blocks=tokens / block_insert_seconds,
        match_tokens_per_second_hashed_blocks=tokens / block_match_seconds,
        workload=spec,
    )


def _blocks_budget_for(hits_needed: int, sessions: tuple[ScoredSequence, ...], window: int,
                       spec: WorkloadSpec, start: int) -> int:
    """The smallest budget, in whole blocks, at which hashed blocks hit ``hits_needed`` tokens.

    Bisection over the block count (an LRU cache's hits do not fall as its capacity grows; the
    search assumes it), starting from ``start`` bytes and doubling until enough.
    """
    block_bytes = spec.block_size * spec.bytes_per_token

    def hits(blocks: int) -> int:
        cache = HashedBlockCache.with_budget(blocks * block_bytes, block_size=spec.block_size,
                                             bytes_per_token=spec.bytes_per_token)
        return _admit_all(sessions, window, _block_admit(cache), cache.release)[0]

    low, high = 1, max(1, start // block_bytes)
    ceiling = sum(-(-len(s) // spec.block_size) for s in sessions)  # every block of every session
    while hits(high) < hits_needed:
        if high >= ceiling:
            return ceiling * block_bytes
        low, high = high + 1, min(2 * high, ceiling)
    while low < high:
        middle = (low + high) // 2
        if hits(middle) >= hits_needed:
            high = middle
        else:
            low = middle + 1
    return high * block_bytes


def _trie_admit(trie: PrefixTrie) -> Callable[[ScoredSequence], tuple[SessionId, int]]:
    def admit(session: ScoredSequence) -> tuple[SessionId, int]:
        result = trie.insert(session.tokens, session.log2_probs)
        if result.session is None:
            raise AssertionError("a locked insert returned no session")
        return result.session, result.hit_tokens

    return admit


def _block_admit(
    cache: HashedBlockCache,
) -> Callable[[ScoredSequence], tuple[BlockSessionId, int]]:
    def admit(session: ScoredSequence) -> tuple[BlockSessionId, int]:
        allocation = cache.allocate(session.tokens)
        return allocation.session, allocation.hit_tokens

    return admit


def _admit_all(
    sessions: tuple[ScoredSequence, ...],
    window: int,
    admit: Callable[[ScoredSequence], tuple[S, int]],
    release: Callable[[S], object],
) -> tuple[int, float]:
    """Admit every session, keeping ``window`` live; total hit tokens and seconds taken."""
    live: deque[S] = deque()
    hits = 0
    start = time.perf_counter()
    for session in sessions:
        handle, hit = admit(session)
        hits += hit
        live.append(handle)
        if len(live) > window:
            release(live.popleft())
    while live:
        release(live.popleft())
    return hits, time.perf_counter() - start


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _zipf(count: int, exponent: float) -> npt.NDArray[np.float64]:
    weights = np.arange(1, count + 1, dtype=np.float64) ** -exponent
    normalised: npt.NDArray[np.float64] = weights / weights.sum()
    return normalised

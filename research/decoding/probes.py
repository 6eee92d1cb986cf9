"""Measurements that decide how exact decoding can go faster: which schedules give equal bits, and
what a forward costs.

Arithmetic decoding needs the encoder's probabilities bit for bit (README, *Exactness*). A faster
decoder computes them on another schedule: several positions per forward (speculation) or
several sessions per forward (batching). This module measures, on the model and backend at hand:

- ``schedule_rows`` / ``schedule_kv``: every position's logit row, and the KV cache, under a
  chunk schedule, so that schedules can be compared bit for bit (chunk boundary invariance);
- ``linear_row_invariance``: for which matmul row counts a linear layer's rows are the same
  (where chunk and batch differences come from);
- ``later_token_independence``: whether a row depends on the tokens *after* it in its forward
  (same shape, other later tokens); this is what ``research.decoding.blocked`` relies on;
- ``batch_invariance``: whether a session's step rows change when it is one row of a batch,
  with equal lengths or left padding and an attention mask;
- ``chunk_timings`` / ``batch_timings``: forward seconds per chunk length and batch size on a
  cache of fixed length, and ``read_bandwidth`` for the weight-traffic bound.

Invariants:
1. Every forward runs inside ``pinned_threads`` (one intra-op thread), as the codec's do
   (enforced).
2. ``RowComparison.identical`` counts rows equal in every bit (``numpy.array_equal`` on float32),
   not within a tolerance (enforced).
3. The probes never change the model; each builds and discards its own caches (enforced).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from research.decoding.forward import LogitRows, crop_to, forward_rows
from seqkv.models.adapter import CausalLM
from seqkv.schedule import pinned_threads


@dataclass(frozen=True)
class RowComparison:
    """Two computations of the same positions' rows, compared bit for bit."""

    case: str
    rows: int
    identical: int  # rows equal in every bit
    max_abs_diff: float

    @property
    def bit_identical(self) -> bool:
        return self.identical == self.rows


def compare_rows(case: str, a: LogitRows, b: LogitRows) -> RowComparison:
    """Row-by-row bit identity and the largest absolute difference of two ``[N, V]`` arrays."""
    assert a.shape == b.shape, (a.shape, b.shape)
    # Bits, not values: -0.0 and 0.0 differ here, and a NaN equals the same NaN.
    same_bits = np.ascontiguousarray(a).view(np.uint8) == np.ascontiguousarray(b).view(np.uint8)
    equal = int(same_bits.reshape(a.shape[0], -1).all(axis=1).sum()) if a.size else 0
    diff = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0
    return RowComparison(case, int(a.shape[0]), equal, diff)


def chunk_sizes(count: int, size: int, first: int | None = None) -> list[int]:
    """Chunk lengths covering ``count`` positions: ``first`` (if given), then ``size`` each.

    >>> chunk_sizes(10, 4), chunk_sizes(10, 4, first=3)
    ([4, 4, 2], [3, 4, 3])
    """
    if size < 1 or (first is not None and first < 1):
        raise ValueError(f"chunk lengths must be positive, got size={size}, first={first}")
    sizes = [] if first is None else [min(first, count)]
    while sum(sizes) < count:
        sizes.append(min(size, count - sum(sizes)))
    return sizes


def schedule_rows(model: CausalLM, tokens: Sequence[int], sizes: Sequence[int]) -> LogitRows:
    """The rows ``[len(tokens), V]`` of ``tokens`` forwarded in consecutive chunks of ``sizes``."""
    assert sum(sizes) == len(tokens)
    cache = DynamicCache()
    rows: list[LogitRows] = []
    with pinned_threads():
        start = 0
        for size in sizes:
            rows.append(forward_rows(model.model, cache, tokens[start : start + size]))
            start += size
    return np.concatenate(rows)  # [N, V]


def schedule_kv(model: CausalLM, tokens: Sequence[int], sizes: Sequence[int]) -> torch.Tensor:
    """The KV ``[layers, 2, kv_heads, len(tokens), head_dim]`` of ``tokens`` in chunks of ``sizes``.
    """
    assert sum(sizes) == len(tokens)
    cache = DynamicCache()
    with pinned_threads():
        start = 0
        for size in sizes:
            forward_rows(model.model, cache, tokens[start : start + size])
            start += size
    return model.kv_tensor(cache)


@dataclass(frozen=True)
class LinearRows:
    """For one weight shape: the row counts M whose output rows equal those of a large matmul."""

    out_features: int
    in_features: int
    identical_row_counts: tuple[int, ...]  # M in 1..max_rows with every row bit-identical
    max_rows: int


@torch.inference_mode()
def linear_row_invariance(model: CausalLM, max_rows: int = 32, seed: int = 0,
                          threads: int = 1) -> list[LinearRows]:
    """Per distinct linear weight shape: is ``x[:M] @ W.T`` row-for-row ``(x @ W.T)[:M]``?

    ``x`` is ``2 * max_rows`` random rows; ``W`` the model's own first weight of that shape; the
    reference product runs on one thread, the M-row ones on ``threads``. A
    GEMM whose rows do not depend on M lets sessions share one matmul (batching) and chunks of
    different lengths share rows, as far as the linear layers go.
    """
    weights: dict[tuple[int, int], torch.Tensor] = {}
    for module in model.model.modules():
        if isinstance(module, torch.nn.Linear):
            out_features, in_features = module.weight.shape  # [out, in]
            weights.setdefault((int(out_features), int(in_features)), module.weight)
    generator = torch.Generator().manual_seed(seed)
    results = []
    for (out_features, in_features), weight in sorted(weights.items()):
        x = torch.randn(2 * max_rows, in_features, generator=generator,
                        dtype=weight.dtype)  # [2M, in]
        with pinned_threads():
            full = torch.nn.functional.linear(x, weight)  # [2M, out]
        with pinned_threads(threads):
            same = tuple(m for m in range(1, max_rows + 1)
                         if torch.equal(torch.nn.functional.linear(x[:m], weight), full[:m]))
            results.append(LinearRows(out_features, in_features, same, max_rows))
    return results


@dataclass(frozen=True)
class LaterTokenResult:
    """Per chunk length: rows and KV at or before a cut, with other tokens after the cut."""

    chunk: int
    chunks: int  # forwards compared
    rows: int  # rows at or before the cut, over all chunks
    identical_rows: int
    identical_kv_chunks: int  # chunks whose KV at or before the cut was bit-identical
    max_abs_diff: float

    @property
    def bit_identical(self) -> bool:
        return self.identical_rows == self.rows and self.identical_kv_chunks == self.chunks


def later_token_independence(
    model: CausalLM, tokens: Sequence[int], chunk: int, seed: int = 0
) -> LaterTokenResult:
    """Forward each aligned chunk twice, the second time with random tokens after a random cut.

    The cache before each chunk holds the true tokens; the cut is drawn per chunk.
    """
    generator = np.random.default_rng(seed)
    cache = DynamicCache()
    rows = identical = identical_kv = chunks = 0
    max_diff = 0.0
    with pinned_threads():
        for start in range(0, len(tokens), chunk):
            true = list(tokens[start : start + chunk])
            cut = int(generator.integers(0, len(true)))
            later = generator.integers(0, model.vocab_size, len(true) - cut - 1)
            other = true[: cut + 1] + [int(t) for t in later]
            other_rows = forward_rows(model.model, cache, other)[: cut + 1]  # [cut + 1, V]
            other_kv = model.kv_tensor(cache)[:, :, :, start : start + cut + 1]
            crop_to(cache, start)
            true_rows = forward_rows(model.model, cache, true)[: cut + 1]  # [cut + 1, V]
            true_kv = model.kv_tensor(cache)[:, :, :, start : start + cut + 1]
            comparison = compare_rows("", other_rows, true_rows)
            chunks += 1
            rows += comparison.rows
            identical += comparison.identical
            identical_kv += int(torch.equal(other_kv, true_kv))
            max_diff = max(max_diff, comparison.max_abs_diff)
    return LaterTokenResult(chunk, chunks, rows, identical, identical_kv, max_diff)


@torch.inference_mode()
def batched_step_rows(
    model: PreTrainedModel, sessions: Sequence[Sequence[int]], pad_token: int = 0
) -> list[LogitRows]:
    """Each session's rows when all are stepped together, one position per forward.

    Shorter sessions are left-padded with ``pad_token``, masked out by the attention mask, and
    their position ids start at 0 with their first real token, as a serving engine batches them.
    Without padding no mask is passed, exactly as ``forward_rows`` calls the model.
    """
    longest = max(len(s) for s in sessions)
    offsets = [longest - len(s) for s in sessions]
    padded = any(offsets)
    cache = DynamicCache()
    out: list[list[LogitRows]] = [[] for _ in sessions]
    for step in range(longest):
        ids = [[s[step - o] if step >= o else pad_token] for s, o in zip(sessions, offsets,
                                                                             strict=True)]
        x = torch.tensor(ids, dtype=torch.long, device=model.device)  # [B, 1]
        if padded:
            mask = torch.tensor([[int(t >= o) for t in range(step + 1)] for o in offsets],
                                dtype=torch.long, device=model.device)  # [B, step + 1]
            positions = torch.tensor([[max(0, step - o)] for o in offsets],
                                     dtype=torch.long, device=model.device)  # [B, 1]
            output = model(input_ids=x, attention_mask=mask, position_ids=positions,
                           cache=cache, use_cache=True)
        else:
            output = model(input_ids=x, cache=cache, use_cache=True)
        logits = output.logits[:, -1].float().cpu().numpy()  # [B, V]
        for index, offset in enumerate(offsets):
            if step >= offset:
                out[index].append(logits[index])
    return [np.stack(rows) for rows in out]  # each [len(session), V]


def batch_invariance(
    model: CausalLM,
    sessions: Sequence[Sequence[int]],
    batch_sizes: Sequence[int],
    paddings: Sequence[int] = (2, 6),
) -> list[RowComparison]:
    """Session 0's step rows as one row of a batch, against alone and against other batches.

    ``sessions`` must hold at least ``max(batch_sizes)`` sessions of one length ``L``. Equal
    lengths: session 0 in a batch with sessions ``1..B-1``. Padded: session 0 cut to
    ``L - max(paddings)`` tokens, in a batch whose other sessions are ``pad`` tokens longer, so
    it is left-padded by ``pad`` (batches of 2 or more).
    """
    largest = max(batch_sizes)
    length = len(sessions[0]) if sessions else 0
    if len(sessions) < largest or any(len(s) != length for s in sessions):
        raise ValueError(f"need {largest} sessions of one length, got {len(sessions)}")
    probe_length = length - max(paddings)
    if probe_length < 1 or min(paddings) < 1:
        raise ValueError(f"paddings {list(paddings)} must be >= 1 and shorter than the "
                         f"sessions ({length} tokens)")
    pad = int(getattr(model.config, "pad_token_id", None) or 0)
    probe = list(sessions[0][:probe_length])

    def padded_batch(batch: int, padding: int) -> list[list[int]]:
        return [probe] + [list(s[: probe_length + padding]) for s in sessions[1:batch]]

    with pinned_threads():
        alone = batched_step_rows(model.model, [sessions[0]], pad)[0]  # [L, V]
        equal = {b: batched_step_rows(model.model, sessions[:b], pad)[0] for b in batch_sizes}
        padded = {(b, p): batched_step_rows(model.model, padded_batch(b, p), pad)[0]
                  for b in batch_sizes if b >= 2 for p in paddings}
    results: list[RowComparison] = []
    for b in batch_sizes:
        results.append(compare_rows(f"equal lengths, batch {b} vs alone", equal[b], alone))
        if b != largest:
            results.append(compare_rows(f"equal lengths, batch {b} vs batch {largest}",
                                        equal[b], equal[largest]))
    for (b, p), rows in padded.items():
        results.append(compare_rows(f"padded by {p}, batch {b} vs alone", rows,
                                    alone[:probe_length]))
        if b != largest:
            results.append(compare_rows(
                f"padded by {p}, batch {b} vs batch {largest} padded by {p}",
                rows, padded[largest, p]))
        if p != paddings[0]:
            results.append(compare_rows(f"padded by {p}, batch {b} vs padded by {paddings[0]}",
                                        rows, padded[b, paddings[0]]))
    return results


@dataclass(frozen=True)
class Timing:
    """Median wall seconds of one forward of ``size`` (chunk positions or batch rows)."""

    kind: str  # "chunk" or "batch"
    size: int
    context: int  # cache positions before the forward
    seconds: float
    repeats: int

    @property
    def seconds_per_token(self) -> float:
        return self.seconds / self.size


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def chunk_timings(model: CausalLM, context: Sequence[int], lengths: Sequence[int],
                  repeats: int = 5) -> list[Timing]:
    """Forward seconds of a chunk of each length after ``context`` (batch 1)."""
    cache = DynamicCache()
    results = []
    with pinned_threads():
        forward_rows(model.model, cache, context)
        base = len(context)
        for length in lengths:
            ids = [int(context[i % base]) for i in range(length)]

            def run(ids: list[int] = ids) -> None:
                forward_rows(model.model, cache, ids)
                crop_to(cache, base)

            run()  # warm-up: first calls of a new shape allocate
            results.append(Timing("chunk", length, base, _median_seconds(run, repeats), repeats))
    return results


def _repeat_cache(cache: DynamicCache, batch: int) -> DynamicCache:
    repeated = DynamicCache()
    for index, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        assert isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)
        repeated.update(keys.repeat(batch, 1, 1, 1), values.repeat(batch, 1, 1, 1),
                        index)  # [B, H, T, D]
    return repeated


def batch_timings(model: CausalLM, context: Sequence[int], batch_sizes: Sequence[int],
                  repeats: int = 5) -> list[Timing]:
    """Forward seconds of one step of ``B`` sessions, each after ``context`` (one token each)."""
    single = DynamicCache()
    results = []
    with pinned_threads():
        forward_rows(model.model, single, context)
        base = len(context)
        for batch in batch_sizes:
            cache = _repeat_cache(single, batch)
            x = torch.full((batch, 1), int(context[0]), dtype=torch.long)  # [B, 1]

            @torch.inference_mode()
            def run(x: torch.Tensor = x, cache: DynamicCache = cache) -> None:
                model.model(input_ids=x, cache=cache, use_cache=True)
                crop_to(cache, base)

            run()
            results.append(Timing("batch", batch, base, _median_seconds(run, repeats), repeats))
    return results


def weight_bytes(model: CausalLM) -> int:
    """Bytes of the model's parameters (tied matrices once): what one forward streams at least."""
    seen: set[int] = set()
    total = 0
    for parameter in model.model.parameters():
        if parameter.data_ptr() not in seen:
            seen.add(parameter.data_ptr())
            total += parameter.numel() * parameter.element_size()
    return total


def read_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second one thread reads from memory (sum of a float32 array), median."""
    values = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32)
    with pinned_threads():
        values.sum()
        seconds = _median_seconds(values.sum, repeats)
    return values.numel() * 4 / seconds

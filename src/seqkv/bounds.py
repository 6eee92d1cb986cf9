"""The cheap bounds every writer checks on what it has just coded, before anything is written.

``seqkv check`` measures the paper's claims at length; these are the inequalities a correct
encoder satisfies on every run, cheap enough to evaluate each time (one float prefill at most):

- ``code_within_table_cost``: the token code is at most the sum of ``-log2(count / 2**32)``
  under the tables the coder used, plus the arithmetic coder's 2-bit flush. Catches a coder bug.
- ``code_within_reference_cross_entropy`` (model-coded levels): the code is at most the model's
  cross-entropy on the same tokens, recomputed independently by one prefill per segment (another
  schedule than the coder's), plus the flush, the tables' quantization loss and an allowance of
  ``REFERENCE_ALLOWANCE_BITS`` per token for the schedules' float differences. Catches a wrong
  model or wrong tables (a distribution sharpened or flattened where the tables are built) that
  the first bound, which trusts the coder's own tables, cannot see.
- ``code_within_uniform`` (``plain``): the code is at most the uniform code's.
- ``code_within_mixing_regret`` (levels that mix): the code is at most 1.001 times what the
  unmixed predictor would have cost, plus 16 bits.
- ``residual_within_tolerance``: every KV component the decoder will rebuild is within the
  tolerance of the caller's KV (equal to the bit at tolerance 0).
- ``file_bytes_accounted``: the file's sections add up to its length.

A violated bound raises ``BoundViolationError`` carrying every bound: nothing is returned, so
nothing is written.

Invariants:
1. Bounds only read what the encoder produced; the reference cross-entropy runs its own forward,
   or reads the rows of the caller's prefill that it shares (``shared_prefill``), never the
   coder's (enforced: ``reference_surprisal`` takes tokens and a float prefill's rows, not the
   encoder's probabilities).
2. Every allowance is derived or measured and stated in its ``detail`` (checked by tests that a
   sharpened and a flattened distribution violate the reference bound).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from seqkv.coding.frequencies import TOTAL_FREQUENCY
from seqkv.errors import SeqKVError
from seqkv.kvcache import with_cache
from seqkv.models.adapter import CausalLM
from seqkv.schedule import pinned_threads, schedule_threads

FLUSH_BITS = 2
# NOTE: a per-token allowance for the float differences between the coder's schedule and one
# prefill. Measured on SmolLM2-135M (CPU): the two cross-entropies differ by about 1e-5
# bits/token; 0.01 bits/token (0.2% of a typical 4.5) leaves a 1,000x margin, while a
# distribution sharpened 50x or a uniform one costs bits per token more.
REFERENCE_ALLOWANCE_BITS = 0.01


class BoundViolationError(SeqKVError):
    """A bound every correct encoding satisfies does not hold on what was just coded."""

    def __init__(self, bounds: Sequence[Bound]) -> None:
        self.bounds = tuple(bounds)
        failed = [b for b in self.bounds if not b.holds]
        first = failed[0]
        super().__init__(
            f"bound {first.name} violated: measured {first.measured:,.6g} > bound "
            f"{first.bound:,.6g} ({first.detail}); nothing was written"
            + (f" ({len(failed) - 1} more bounds violated)" if len(failed) > 1 else "")
        )


@dataclass(frozen=True)
class Bound:
    """One inequality ``measured <= bound`` evaluated on one coded session."""

    name: str
    statement: str
    bound: float
    measured: float
    holds: bool
    detail: str


def quantization_loss_bits(vocab_size: int) -> float:
    """Largest extra cost per token of the 2**32-total frequency tables over -log2 p."""
    return float(-np.log2(1 - vocab_size / TOTAL_FREQUENCY))


def code_within_table_cost(code_bits: int, table_cost_bits: float) -> Bound:
    bound = table_cost_bits + FLUSH_BITS
    return Bound("code_within_table_cost",
                 "token code <= sum of -log2(count / 2^32) under the coder's tables + 2 bits",
                 bound, float(code_bits), code_bits <= bound,
                 f"table cost {table_cost_bits:,.3f} bits + {FLUSH_BITS} bits of flush")


def code_within_reference_cross_entropy(code_bits: int, reference_bits: float, tokens: int,
                                        vocab_size: int, relative: float = 0.0) -> Bound:
    """``relative``: a fraction of the reference allowed on top, for a level coding under
    another predictor of the same model (the integer predictor: ``seqkv.levels.portable``)."""
    eps = quantization_loss_bits(vocab_size)
    bound = (reference_bits * (1 + relative) + FLUSH_BITS
             + tokens * (eps + REFERENCE_ALLOWANCE_BITS))
    share = f" + {relative:.0%} of it" if relative else ""
    return Bound("code_within_reference_cross_entropy",
                 "token code <= the model's cross-entropy on the same tokens, recomputed by "
                 f"one prefill per segment{share}, + 2 + n (eps_q + delta)",
                 bound, float(code_bits), code_bits <= bound,
                 f"reference {reference_bits:,.3f} bits over {tokens} tokens "
                 f"({reference_bits / tokens:.4f} bits/token); eps_q = {eps:.3g}, delta = "
                 f"{REFERENCE_ALLOWANCE_BITS} bits/token")


# NOTE: seqkv.mixing.mixer's stated regret: mixed code <= 1.0005 base + 9 bits (+ a rounding
# term under 4e-4 bits per token of probability above 2**-20); every run checks the target
# of 1.001 base + 16 bits, which contains it.
MIXING_REGRET_FACTOR = 1.001
MIXING_REGRET_BITS = 16.0


def code_within_mixing_regret(code_bits: int, base_bits: float) -> Bound:
    bound = MIXING_REGRET_FACTOR * base_bits + MIXING_REGRET_BITS + FLUSH_BITS
    return Bound("code_within_mixing_regret",
                 "token code <= 1.001 x the unmixed predictor's code + 16 + 2 bits (mixing "
                 "never costs much more than the model alone)",
                 bound, float(code_bits), code_bits <= bound,
                 f"the predictor alone: {base_bits:,.3f} bits")


def code_within_uniform(code_bits: int, tokens: int, vocab_size: int) -> Bound:
    bound = tokens * (float(np.log2(vocab_size)) + quantization_loss_bits(vocab_size)) + FLUSH_BITS
    return Bound("code_within_uniform", "token code <= n log2 V + 2 + n eps_q (plain ids)",
                 bound, float(code_bits), code_bits <= bound,
                 f"{tokens} tokens over a vocabulary of {vocab_size}")


def residual_within_tolerance(max_abs_error: float, tolerance: float, residual_bits: int,
                              escapes: int) -> Bound:
    return Bound("residual_within_tolerance",
                 "max |decoded KV - caller's KV| <= tolerance (bit-exact at 0)",
                 tolerance, max_abs_error, max_abs_error <= tolerance,
                 f"residual {residual_bits:,} bits, {escapes:,} escaped components")


def file_bytes_accounted(file_bytes: int, sections: dict[str, int]) -> Bound:
    total = sum(sections.values())
    parts = ", ".join(f"{name} {size:,}" for name, size in sections.items())
    return Bound("file_bytes_accounted", "the file's sections add up to its length",
                 float(total), float(file_bytes), file_bytes == total, parts)


def raise_unless_all_hold(bounds: Sequence[Bound]) -> None:
    if not all(bound.holds for bound in bounds):
        raise BoundViolationError(bounds)


# NOTE: rows of float64 log-softmax at a time in ``reference_surprisal``: 256 x 49,152 x 8 bytes
# = 100 MB for SmolLM2.
_SURPRISAL_ROWS = 256
# NOTE: rows of the output layer at a time (``logit_blocks``): blocks are never smaller than this
# (the remainder joins the last one), and a forward over fewer than twice this many tokens runs the
# output layer once over all of them, the product the network itself computes. Measured here
# (SmolLM2, torch 2.13 CPU), the output layer on blocks of 4, 8, 16 or 256 to 511 rows gives the
# bits of the whole-matrix product, on blocks of 1, 2, 3, 5 or 7 rows other bits (a
# matrix-vector kernel); 511 x 49,152 float32 logits are 100 MB.
_HEAD_ROWS = 256


def logit_blocks(network: Any, ids: list[int], wanted: slice, cache: Any | None = None
                 ) -> Iterator[tuple[int, torch.Tensor]]:
    """The logit rows ``wanted`` of one forward over ``ids`` (filling ``cache``, which must be
    empty, when given), as (offset into ``wanted``, ``[rows, V]``) blocks, each the output layer
    over at least ``_HEAD_ROWS`` rows (a shorter ``wanted`` is cut from a window of that many).

    The backbone runs once, its last hidden state caught by a hook on ``base_model`` while the
    network computes the last position's logits only (``logits_to_keep=1``); the output layer
    (``get_output_embeddings``) then runs on each block. That is the network's own head only
    when the network's logits are the output layer of the base model's last hidden state: the
    head of the caught last row is compared with the network's own last row (the same one-row
    product: equal, compared to 1e-4), and a network that scales or caps its logits (another
    architecture), or has no ``logits_to_keep``, runs its whole ``[T, V]`` forward instead."""
    start, stop = wanted.indices(len(ids))[:2]
    if cache is not None and cache.get_seq_length() != 0:
        raise ValueError("logit_blocks fills an empty cache: this one holds positions already")
    tensor = torch.tensor([ids], device=network.device)
    fill: dict[str, Any] = ({} if cache is None
                            else {**with_cache(network, cache), "use_cache": True})
    head = network.get_output_embeddings()
    base = getattr(network, "base_model", None)
    hidden = None
    if (head is not None and base is not None and base is not network
            and "logits_to_keep" in inspect.signature(network.forward).parameters):
        caught: list[torch.Tensor] = []
        hook = base.register_forward_hook(lambda module, args, output: caught.append(output[0]))
        try:
            last = network(input_ids=tensor, logits_to_keep=1, **fill).logits[0, -1]
        finally:
            hook.remove()
        fill = {}  # the cache holds the text now: a fallback forward runs without it
        if (len(caught) == 1 and caught[0].dim() == 3
                and torch.allclose(head(caught[0][0, -1:])[0], last, rtol=1e-4, atol=1e-4)):
            hidden = caught[0][0]
    if hidden is None:
        yield 0, network(input_ids=tensor, **fill).logits[0, start:stop]
        return
    if len(ids) < 2 * _HEAD_ROWS:  # one block, the product the network computes
        yield 0, head(hidden)[start:stop]
        return
    if stop - start < _HEAD_ROWS:  # a window of _HEAD_ROWS rows around them (len(ids) >= 512)
        low = max(0, min(start, stop - _HEAD_ROWS))
        high = max(stop, low + _HEAD_ROWS)
        yield 0, head(hidden[low:high])[start - low : stop - low]
        return
    cuts = list(range(start, stop, _HEAD_ROWS))
    if stop - cuts[-1] < _HEAD_ROWS:
        cuts.pop()  # the remainder joins the last block
    for index, cut in enumerate(cuts):
        end = cuts[index + 1] if index + 1 < len(cuts) else stop
        yield cut - start, head(hidden[cut:end])


def block_surprisal(logits: torch.Tensor, targets: torch.Tensor) -> npt.NDArray[np.float64]:
    """``-log2 p(targets[j])`` under logit row ``j`` (``[rows, V]``), by a float64 log-softmax
    over ``_SURPRISAL_ROWS`` rows at a time (a row's result does not depend on the others)."""
    out = np.empty(len(targets))
    for start in range(0, len(targets), _SURPRISAL_ROWS):
        rows = logits[start : start + _SURPRISAL_ROWS].double().cpu()
        picked = targets[start : start + len(rows)]
        log2p = torch.log_softmax(rows, dim=-1) / np.log(2.0)  # [rows, V]
        out[start : start + len(rows)] = -log2p[torch.arange(len(rows)), picked].numpy()
    return out


def _surprisal(network: Any, ids: Sequence[int], first_row: int, targets: torch.Tensor,
               cache: Any | None = None) -> npt.NDArray[np.float64]:
    """``-log2 p(targets[j])`` under logit row ``first_row + j`` of one forward over ``ids``
    (filling ``cache`` when given, as ``logit_blocks``).

    The output layer and the float64 log-softmax run on blocks of rows (``logit_blocks``): a
    row's result does not depend on the others, and the whole ``[T, V]`` matrices were 1.6 GB
    (float32 logits) and 3.2 GB (float64) at the model's 8,192 tokens."""
    out = np.empty(len(targets))
    wanted = slice(first_row, first_row + len(targets))
    for offset, block in logit_blocks(network, list(ids), wanted, cache):
        out[offset : offset + len(block)] = block_surprisal(
            block, targets[offset : offset + len(block)])
    return out


@torch.inference_mode()
def reference_surprisal(model: CausalLM, segments: Sequence[Sequence[int]],
                        context: int | None, prefix: Sequence[int] = (),
                        dtype: torch.dtype | None = None,
                        prefilled: Prefill | None = None) -> npt.NDArray[np.float64]:
    """``-log2 p(t_i | t_<i)`` of every token of ``segments``, one prefill per segment.

    As the coding levels code them: a segment continues ``prefix`` when there is one; otherwise
    its tokens are a sequence of their own whose first token is coded under the distribution
    after ``context`` alone (the start token, forwarded once for all segments), or uniformly
    without one. The forward is transformers' own, in ``dtype`` (default the model's), with
    float64 log-softmax: another schedule than any coder's, so its result is an independent
    reference. ``prefilled`` (a ``shared_prefill`` over the prefix and the segments) gives the
    first segment's rows from that forward instead of its own, in the model's dtype only.
    """
    network = model.model if dtype is None else model.twin(dtype)
    start: list[torch.Tensor] = []  # the start token's logit row, forwarded at most once

    def first(token: int) -> npt.NDArray[np.float64]:
        """``-log2 p`` of a sequence's first token, after the start token alone."""
        if context is None:
            return np.array([np.log2(model.vocab_size)])
        if not start:
            start.extend(block for _, block in logit_blocks(network, [context], slice(0, 1)))
        return block_surprisal(start[0], torch.tensor([token]))

    out: list[npt.NDArray[np.float64]] = []
    for index, segment in enumerate(segments):
        targets = torch.tensor(list(segment), dtype=torch.long)
        shared = (prefilled.surprisal if prefilled is not None and index == 0 and dtype is None
                  else None)
        if shared is not None:
            # row i of the prefill codes token i + 1: the segment's rows follow the prefix's
            rows = shared[max(len(prefix) - 1, 0) : len(prefix) + len(segment) - 1]
            out.append(rows if prefix else np.concatenate([first(segment[0]), rows]))
        elif prefix:
            out.append(_surprisal(network, [*prefix, *segment], len(prefix) - 1, targets))
        else:  # a one-token segment has no row of its own to read
            rest = (_surprisal(network, segment, 0, targets[1:]) if len(segment) > 1
                    else np.zeros(0))
            out.append(np.concatenate([first(segment[0]), rest]))
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


@dataclass(frozen=True)
class Prefill:
    """One float prefill over a session's tokens (its shared prefix's included), shared by the
    caller's KV and the reference bound (``shared_prefill``)."""

    kv: torch.Tensor  # [layers, 2, kv_heads, T, head_dim] float32: ``CausalLM.prefill``'s
    # [T - 1]: -log2 p(t_i | t_<i) for i = 1 .. T - 1 under the same forward's rows (None:
    # not asked for)
    surprisal: npt.NDArray[np.float64] | None


@torch.inference_mode()
def shared_prefill(model: CausalLM, tokens: Sequence[int], with_surprisal: bool) -> Prefill:
    """The KV of ``model.prefill(tokens)``, bit for bit (the same forward, on the ``prefill``
    schedule's threads: the logits computed beside it do not change the KV), and,
    ``with_surprisal``, the reference surprisal of every token after the first under that
    forward's rows (``reference_surprisal(..., prefilled=...)``): one forward where a caller's
    prefill and the reference would run two."""
    ids = [int(t) for t in tokens]
    if not with_surprisal:
        return Prefill(model.kv_tensor(model.prefill(ids)), None)
    model.check_tokens(ids)  # as ``prefill``, before the forward
    cache = DynamicCache()
    with pinned_threads(schedule_threads("prefill")):
        surprisal = _surprisal(model.model, ids, 0, torch.tensor(ids[1:], dtype=torch.long),
                               cache)
    return Prefill(model.kv_tensor(cache), surprisal)

"""Exact speculative decoding against a blocked prefill: the encoder never runs the drafts.

``research.decoding.probes`` measures two facts on the CPU backend: a logit row depends on the
shape of the forward that computed it (chunk length, where the chunk starts), but *not* on the
tokens after it in that forward. So fix the shapes and let the contents vary: the stream is coded
under a prefill in blocks (a partition of the positions into consecutive ``[s, e)``, stored with
the stream), and the decoder always forwards a *whole* block on a cache holding exactly the blocks
before it, filling the positions it does not know yet with guesses. Every row whose inputs up to
its own position are right is then the encoder's row, bit for bit, whatever the guesses after it.

Decoder, with the cache holding the ``s`` positions before block ``[s, e)``:

1. fill the block: the known tokens, then ``policy.draft(known, hints, e - len(known))``, then
   copies of the last known token for positions still empty (``fill_block``);
2. forward the block; decode positions ``len(known), ...`` from rows ``len(known) - 1 - s, ...``
   while each decoded token equals the guess in the block at its position (the row for position
   ``e``, the next block's first token, needs no guess);
3. if a guess failed, crop the cache back to ``s`` (the block is forwarded again, now with one
   more known token) and keep the argmax of the rows after the failure as ``hints``; otherwise
   the block is complete and the cache keeps it.

Each forward of a block yields at least one token: a block of ``L`` costs at most ``L`` forwards
of ``L`` positions, and one with good guesses. Blocks of one position are exactly the codec's
token-by-token schedule, so ``(1, 1, ..., 1)`` is today's format as a special case, and
``research.decoding.plan`` lets the encoder pick long blocks only where guesses will hold.

Invariants:
1. The encoder's rows come from forwards of the partition's blocks on a cache holding exactly the
   earlier blocks (enforced, ``blocked_encode``); the decoder forwards only those shapes on those
   cache states (enforced, ``blocked_decode``).
2. A row depends only on the cache, the forward's shape, and the ids at and before its own
   position in the forward (assumed; measured bit-exact on SmolLM2-135M / CPU by
   ``research.decoding.probes.later_token_independence`` and checked by the round-trip tests).
   Under 2 the decoder reproduces the encoder's rows and its final cache bit for bit.
3. The draft policy is the decoder's own choice and is not part of the stream: any policy, or
   none, decodes the same bits (checked by the tests); the partition is part of the stream.
4. The bits cost the cross-entropy of the blocked prefill's rows plus the coder's allowance.

>>> from seqkv.models import tiny_random_llama
>>> from seqkv.levels.drafts import JacobiDraft, NoDraft
>>> model = tiny_random_llama()
>>> coded = blocked_encode(model, [5, 6, 7, 5, 6, 7, 5, 6, 9], blocks=4)
>>> coded.blocks
(4, 4, 1)
>>> blocked_decode(model, coded, NoDraft()).tokens
[5, 6, 7, 5, 6, 7, 5, 6, 9]
>>> blocked_decode(model, coded, JacobiDraft()).tokens
[5, 6, 7, 5, 6, 7, 5, 6, 9]
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from transformers import DynamicCache

from research.decoding.forward import cache_length, crop_to, forward_rows, greedy
from research.decoding.stream import (
    CodedStream,
    DecodedStream,
    DecodingCoder,
    EncodingCoder,
    ScheduleStats,
)
from seqkv.levels.drafts import DraftPolicy, NoDraft
from seqkv.models.adapter import CausalLM
from seqkv.schedule import pinned_threads

# NOTE: 16 positions cost ~2x one position on this CPU (benchmarks/decode_schedules.py); any
# partition is exact, this is only the default when the caller gives a single block length.
DEFAULT_BLOCK = 16


def partition(count: int, blocks: int | Sequence[int]) -> tuple[int, ...]:
    """Block lengths covering ``count`` positions: aligned blocks of one length, or as given.

    >>> partition(9, 4), partition(9, [1, 4, 4])
    ((4, 4, 1), (1, 4, 4))
    """
    if isinstance(blocks, int):
        if blocks < 1:
            raise ValueError(f"block must be a positive number of positions, got {blocks}")
        return tuple(min(blocks, count - s) for s in range(0, count, blocks))
    lengths = tuple(int(b) for b in blocks)
    if any(b < 1 for b in lengths) or sum(lengths) != count:
        raise ValueError(f"block lengths must be positive and sum to the {count} positions, "
                         f"got {len(lengths)} lengths summing to {sum(lengths)}")
    return lengths


def bounds(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """``[s, e)`` of each block of a partition."""
    ends = list(accumulate(lengths))
    return list(zip([0, *ends[:-1]], ends, strict=True))


def blocked_encode(model: CausalLM, tokens: Sequence[int],
                   blocks: int | Sequence[int] = DEFAULT_BLOCK) -> CodedStream:
    """Code ``tokens`` under a prefill in ``blocks`` (one length, aligned, or a partition)."""
    token_list = [int(t) for t in tokens]
    model.check_tokens(token_list)
    count = len(token_list)
    lengths = partition(count, blocks)
    coder = EncodingCoder(token_list)
    context = model.start_token_id
    cache = DynamicCache()
    with pinned_threads():
        coder.code_first(model, context)
        for s, e in bounds(lengths):
            logits = forward_rows(model.model, cache, token_list[s:e])  # [e - s, V]
            for position in range(s + 1, min(e + 1, count)):
                coder.code(position, logits[position - 1 - s])
    stats = ScheduleStats(count, len(lengths), count, 0, 0, lengths)
    return CodedStream(coder.finish(), count, context, coder.cross_entropy_bits,
                       coder.ideal_code_bits, stats, cache, lengths)


def fill_block(known: Sequence[int], s: int, e: int, policy: DraftPolicy,
               hints: Sequence[int]) -> list[int]:
    """Block ``[s, e)``'s inputs: known tokens, the policy's guesses, then the last known token.

    >>> fill_block([1, 2, 3], 2, 6, NoDraft(), [])
    [3, 3, 3, 3]
    """
    missing = e - len(known)
    if missing <= 0:
        return list(known[s:e])
    guesses = policy.draft(known, hints, missing)[:missing]
    return [*known[s:], *guesses, *[known[-1]] * (missing - len(guesses))]


def blocked_decode(model: CausalLM, coded: CodedStream,
                   policy: DraftPolicy | None = None) -> DecodedStream:
    """Decode a ``blocked_encode`` stream along its partition, guessing with ``policy``."""
    count = coded.count
    lengths = partition(count, coded.blocks)
    chosen: DraftPolicy = NoDraft() if policy is None else policy
    coder = DecodingCoder(coded.code, count)
    cache = DynamicCache()
    drafted = accepted = 0
    forwarded: list[int] = []
    with pinned_threads():
        known = [coder.code_first(model, coded.first_token_context)]
        for s, e in bounds(lengths):
            hints: list[int] = []
            while True:
                assert cache_length(cache) == s and len(known) > s
                inputs = fill_block(known, s, e, chosen, hints)
                guessed = max(0, e - len(known))
                logits = forward_rows(model.model, cache, inputs)  # [e - s, V]
                forwarded.append(e - s)
                drafted += guessed
                complete = True
                while len(known) < min(e + 1, count):
                    position = len(known)
                    token = coder.code(position, logits[position - 1 - s])
                    known.append(token)
                    if position < e:
                        if token != inputs[position - s]:
                            complete = False
                            hints = greedy(logits[position - s :])
                            break
                        accepted += 1
                if complete:
                    break
                crop_to(cache, s)
    assert cache_length(cache) == count and len(known) == count
    stats = ScheduleStats(count, len(forwarded), sum(forwarded), drafted, accepted,
                          tuple(forwarded))
    return DecodedStream(coder.tokens, cache, coder.cross_entropy_bits, coder.ideal_code_bits,
                         stats)

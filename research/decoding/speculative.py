"""Exact speculative decoding by replay: the encoder runs the decoder's forwards, guesses included.

The token codec decodes one forward per token because the decoder needs ``P(t_i | t_<i)`` before
it can read ``t_i``. Speculation forwards the last decoded token together with ``d`` guessed
tokens in one chunk: if the decoded token equals the first guess, the chunk's next row is the
distribution of the position after it, and so on, so one forward can yield up to ``d + 1``
tokens. On CPU, logits depend on the chunk shape (``research.decoding.probes``: a row computed in
a chunk differs from the same row computed alone by up to ~1e-4), so the encoder cannot use a
prefill's probabilities. Instead the schedule (chunk contents, lengths and cache crops) is a
deterministic function of the already-coded tokens and a ``DraftPolicy``, and the encoder
*replays* it: one code path, ``_run``, serves both sides, and each position is coded under the
row the decoder will compute for it.

Schedule, with ``k`` tokens known and the cache holding ``k - 1`` positions:

1. ``draft = policy.draft(known, hints, limit=count - k)``;
2. forward ``[known[-1], *draft]``: row ``j`` is the distribution of position ``k + j``;
3. code positions ``k, k+1, ...`` from rows ``0, 1, ...`` while each coded token equals the
   guess forwarded at its position; stop after the first one that does not (that token is still
   coded exactly: its row was computed on correct inputs);
4. crop the cache to the known tokens whose positions it computed; the rows after the rejected
   guess become the next ``hints`` (their argmax, the Jacobi guesses).

After the last token is known, one more forward appends it when the cache lacks it, so the cache
holds exactly the ``count`` coded positions, as ``seqkv.codec``'s does.

Invariants:
1. Encoder and decoder issue the same forwards on the same cache states (enforced: both run
   ``_run``, which learns tokens only from the ``TokenCoder``).
2. The position coded from row ``j`` of a forward has all its inputs confirmed: guesses before
   it in the chunk were accepted (enforced by step 3).
3. With ``NoDraft`` the schedule is exactly ``seqkv.codec``'s (one single-position forward per
   token), so the code equals the codec's token code bit for bit (checked by the tests).
4. Same profile and same calls give the same bits (assumed, ``research.decoding.forward``).
5. The bits cost the cross-entropy of the rows used plus the coder's allowance; those rows
   differ from the token-by-token rows only in rounding (checked by the tests and the
   benchmark).

The cache after ``speculative_decode`` holds the same bits as the encoder's (``_run`` is shared)
but not the bits of a token-by-token run: positions accepted inside a chunk were computed in a
chunk. The coded stream says which policy decodes it; another policy decodes garbage.

>>> from seqkv.models import tiny_random_llama
>>> from seqkv.levels.drafts import PromptLookup
>>> model = tiny_random_llama()
>>> coded = speculative_encode(model, [5, 6, 7, 5, 6, 7, 5, 6], PromptLookup())
>>> speculative_decode(model, coded, PromptLookup()).tokens
[5, 6, 7, 5, 6, 7, 5, 6]
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import DynamicCache

from research.decoding.forward import cache_length, crop_to, forward_rows, greedy
from research.decoding.stream import (
    CodedStream,
    DecodedStream,
    DecodingCoder,
    EncodingCoder,
    ScheduleStats,
    TokenCoder,
)
from seqkv.levels.drafts import DraftPolicy
from seqkv.models.adapter import CausalLM
from seqkv.schedule import pinned_threads


def _run(model: CausalLM, coder: TokenCoder, policy: DraftPolicy,
         context: int | None) -> tuple[DynamicCache, ScheduleStats]:
    count = coder.count
    cache = DynamicCache()
    drafted = accepted = 0
    lengths: list[int] = []
    known = [coder.code_first(model, context)]
    hints: list[int] = []
    while len(known) < count:
        start = len(known)
        assert cache_length(cache) == start - 1
        draft = policy.draft(known, hints, count - start)[: count - start]
        logits = forward_rows(model.model, cache, [known[-1], *draft])  # [1 + d, V]
        lengths.append(1 + len(draft))
        drafted += len(draft)
        hits = 0
        for j in range(len(draft) + 1):
            token = coder.code(start + j, logits[j])
            known.append(token)
            if j == len(draft) or token != draft[j]:
                hints = greedy(logits[j + 1 :])
                break
            hits += 1
            if len(known) == count:
                hints = []
                break
        accepted += hits
        crop_to(cache, start + hits)
    held = cache_length(cache)
    if held < count:
        forward_rows(model.model, cache, known[held:])
        lengths.append(count - held)
    assert cache_length(cache) == count
    return cache, ScheduleStats(count, len(lengths), sum(lengths), drafted, accepted,
                                tuple(lengths))


def speculative_encode(model: CausalLM, tokens: Sequence[int], policy: DraftPolicy) -> CodedStream:
    """Code ``tokens`` along the speculative schedule ``policy`` drives (see the module doc)."""
    token_list = [int(t) for t in tokens]
    model.check_tokens(token_list)
    coder = EncodingCoder(token_list)
    context = model.start_token_id
    with pinned_threads():
        cache, stats = _run(model, coder, policy, context)
    return CodedStream(coder.finish(), len(token_list), context, coder.cross_entropy_bits,
                       coder.ideal_code_bits, stats, cache)


def speculative_decode(model: CausalLM, coded: CodedStream, policy: DraftPolicy) -> DecodedStream:
    """Decode ``coded`` with the same policy that coded it; the tokens and the session's cache."""
    coder = DecodingCoder(coded.code, coded.count)
    with pinned_threads():
        cache, stats = _run(model, coder, policy, coded.first_token_context)
    return DecodedStream(coder.tokens, cache, coder.cross_entropy_bits, coder.ideal_code_bits,
                         stats)

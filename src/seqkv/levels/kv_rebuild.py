"""How a level's coder and decoder compute the float KV its residual is coded against, by the
schedule the level's ``LevelSpec`` names.

Levels whose tokens are coded without float probabilities (``portable`` and its variants,
``ngram``, ``plain``) need the float model only for the KV, so they compute it the way a user
would: one float prefill of the tokens (the ``prefill`` schedule), bit-identical on a machine
from one run to the next (threads pinned, ``seqkv.schedule``), equal to the caller's own prefill
KV (so its residual is empty), and about as fast as restoring the text and prefilling it
(measured: ``benchmarks/restore_vs_zstd.py``). ``ngram`` and ``plain`` files written by earlier
releases computed it with the row-invariant forward in 256-row chunks (the ``rows`` schedule);
a file names its schedule through its execution profile's digest, so their decoders still rebuild
it that way, bit for bit (``LevelSpec.former_schedules``, ``seqkv.codec.kv_schedule``). The byte
layout is unchanged, so no format version moves: an earlier release reading a new file finds
another execution profile and returns its tokens verified and its KV marked inexact.

Invariants:
1. ``rebuild_kv`` on a schedule returns, bit for bit, what it returned for the same tokens,
   prefix and model on the same execution profile (each schedule pins its threads and shapes).
2. After a prefix, the KV continues the prefix's stored KV (the ``prefill`` schedule forwards the
   tail after the whole prefix; the ``rows`` schedule re-forwards the prefix's last token, as its
   coded tokens were).
3. ``prefilled`` is taken only where it is what the ``prefill`` schedule computes: the KV of
   ``CausalLM.prefill`` over the tail, with no prefix. Only an encoder passes it (the codec ran
   that prefill itself for the caller's KV: ``seqkv.codec.encode(kv="prefill")``); a decoder
   never does, so a verifying decode rebuilds the KV on its own (enforced: ``DecodeRequest``
   has no such field).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from seqkv.kvcache import cache_from_tensor, with_cache
from seqkv.levels.row_streams import recompute_kv
from seqkv.models.adapter import CausalLM
from seqkv.models.rows import row_forward
from seqkv.schedule import pinned_threads, schedule_threads
from seqkv.session import Prefix
from seqkv.types import Schedule


def prefill_kv(model: CausalLM, tail: Sequence[int], prefix: Prefix | None,
               prefilled: torch.Tensor | None = None) -> torch.Tensor:
    """The KV ``[layers, 2, kv_heads, prefix + tail, head_dim]`` of one float prefill of the
    tail, continuing the prefix's stored KV: the ``prefill`` schedule. ``prefilled``: that KV,
    which the caller computed already (invariant 3)."""
    if prefilled is not None:
        assert prefix is None, "a codec's own prefill covers the tail alone (invariant 3)"
        return prefilled
    with pinned_threads(schedule_threads("prefill")), torch.inference_mode():
        ids = torch.tensor([list(tail)], dtype=torch.long, device=model.device)  # [1, T]
        cache = (None if prefix is None or prefix.kv is None
                 else cache_from_tensor(prefix.kv.to(model.device, model.dtype)))
        if cache is None:
            return model.kv_tensor(model.prefill(list(tail)))
        model.model(input_ids=ids, **with_cache(model.model, cache), use_cache=True,
                    logits_to_keep=1)  # as prefill
        return model.kv_tensor(cache)


def rebuild_kv(model: CausalLM, schedule: Schedule, tail: Sequence[int],
               prefix: Prefix | None, prefilled: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, int]:
    """The KV of prefix + tail on ``schedule`` (``prefill`` or ``rows``), and the forwards it
    took (one prefill, the caller's where it gave it as ``prefilled``; the row-invariant
    forward's chunks)."""
    if schedule == "prefill":
        return prefill_kv(model, tail, prefix, prefilled), 1
    if schedule == "rows":
        engine = row_forward(model)
        before = engine.forwards
        with pinned_threads(schedule_threads("rows")):
            kv = recompute_kv(engine, tail, prefix)
        return kv, engine.forwards - before
    raise ValueError(f"no KV rebuild on the {schedule!r} schedule")

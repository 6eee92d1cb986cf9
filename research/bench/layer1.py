"""``python -m research.bench layer1``: layer 1 measured on the store itself, token-granular
prefixes (the store's trie and index) against whole hashed blocks (vLLM's 16 tokens).

Motivation: the trie's byte advantage over hashed blocks comes from token granularity: a
session that shares 37 tokens with a stored one reuses 37, where a block index reuses 32. Here
both run through the same ``SessionStore`` code on the same workload, so the figure is the
store's own: every session of the trie bench's generated traffic
(``research.bench.trie.generate_workload``; no model, tokens coded by ``TokensCodec`` at
``plain``) is put into two fresh directory stores, one as the store puts it, one with every
match cut down to a multiple of ``block_size`` tokens (what a hashed-block index can find).

Figures, per provider, at each checkpoint of ``every`` sessions (a report row each, written
as it is measured, so a background run leaves its progress): the hit rate (tokens found
stored over tokens put), the record bytes the store holds, the tokens it coded, and those
tokens' KV at fp16 for SmolLM2-135M (23,040 bytes a token): what a KV store of the same
matches would hold. The two providers see the same sessions in the same order; their hit
rates differ, so bytes are compared at each provider's own hit rate, not at an equal one.

Invariants:
1. The same ``seed`` and spec give the same sessions and the same figures (checked: no timing
   is reported, the workload comes from one seeded generator).
2. The block provider's matches are the store's cut down to whole blocks, never longer
   (enforced in ``_block_granular``), and its records decode like any others (checked: the
   last session of each store is read back).
"""

from __future__ import annotations

import dataclasses
import platform
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from research.bench.trie import (
    FP16_BYTES,
    SMOLLM2_KV_COMPONENTS_PER_TOKEN,
    WorkloadSpec,
    generate_workload,
)
from seqkv.provenance import start_run
from seqkv.store import SessionStore, TokensCodec
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.codec import SpanCodec
from seqkv.store.ids import Tenant
from seqkv.store.prefixes import Lookup, Match

KV_BYTES_PER_TOKEN = SMOLLM2_KV_COMPONENTS_PER_TOKEN * FP16_BYTES
PROVIDERS = ("trie", "blocks")


@dataclass(frozen=True, slots=True)
class Layer1Row:
    """One provider's totals after ``sessions`` sessions."""

    provider: str
    sessions: int
    tokens: int
    shared_tokens: int
    coded_tokens: int
    record_bytes: int

    @property
    def hit_rate(self) -> float:
        return self.shared_tokens / self.tokens if self.tokens else 0.0

    @property
    def kv_bytes(self) -> int:
        return self.coded_tokens * KV_BYTES_PER_TOKEN

    def markdown(self) -> str:
        return (f"| {self.provider} | {self.sessions:,} | {self.tokens:,} | {self.hit_rate:.4f} "
                f"| {self.coded_tokens:,} | {self.record_bytes:,} | {self.kv_bytes:,} |")


def _block_granular(store: SessionStore, block: int) -> None:
    """Cut every match of ``store``'s puts down to whole blocks (invariant 2)."""
    matcher = store._prefixes
    found = matcher.find

    def find(tenant: Tenant, tokens: Sequence[int], target: torch.Tensor | None,
             codec: SpanCodec, *, lock: bool) -> tuple[Match, Lookup | None]:
        match, lookup = found(tenant, tokens, target, codec, lock=lock)
        cut = match.length // block * block
        if cut == match.length:
            return match, lookup
        if match.node is not None:
            store.hot.unlock(match.node)
        if lookup is None:
            lookup = matcher.lookup(tenant, tokens)
        return Match(cut, match.state if cut else None, match.candidates), lookup

    matcher.find = find  # type: ignore[method-assign]


def run_layer1(spec: WorkloadSpec, seed: int, every: int, report: Path,
               command: str, log: Callable[[str], None] | None = None) -> list[Layer1Row]:
    """Put the workload into both stores; append a row per provider every ``every`` sessions
    (and at the end) to ``report``."""
    sessions = generate_workload(spec, seed)
    # NOTE: rows stream into the report as they are measured, so the header goes first with
    # the load at the start; the load at the end closes the report.
    header = start_run(f"none (`TokensCodec({spec.vocab_size}, 'plain')`)",
                       f"the trie bench's generated workload, seed {seed}, "
                       f"{spec.sessions:,} sessions", command)
    rows: list[Layer1Row] = []
    report.parent.mkdir(parents=True, exist_ok=True)
    with report.open("w") as out:
        out.write(
            "# Layer 1 on the store: token-granular prefixes against hashed blocks\n\n"
            f"{header.markdown()}\n\n"
            f"Python {platform.python_version()}. Blocks of {spec.block_size} tokens. "
            "KV bytes: tokens coded x 23,040 (SmolLM2-135M at fp16). Written by "
            "`research.bench.layer1`.\n\n"
            "| provider | sessions | tokens | hit rate | tokens coded | record bytes | "
            "KV bytes |\n|---|---:|---:|---:|---:|---:|---:|\n")
        out.flush()
        with tempfile.TemporaryDirectory(prefix="seqkv-layer1-") as scratch:
            stores = {name: SessionStore(DirectoryBackend(Path(scratch) / name),
                                         lambda level: TokensCodec(spec.vocab_size, level))
                      for name in PROVIDERS}
            _block_granular(stores["blocks"], spec.block_size)
            totals = {name: Layer1Row(name, 0, 0, 0, 0, 0) for name in PROVIDERS}
            for index, session in enumerate(sessions):
                tokens = [int(t) for t in session.tokens]
                for name, store in stores.items():
                    put = store.put(f"s{index}", tokens, level="plain", namespace="bench")
                    row = totals[name]
                    totals[name] = dataclasses.replace(
                        row, sessions=row.sessions + 1, tokens=row.tokens + len(tokens),
                        shared_tokens=row.shared_tokens + put.shared_tokens,
                        coded_tokens=row.coded_tokens + put.coded_tokens,
                        record_bytes=row.record_bytes + put.record_bytes)
                if (index + 1) % every == 0 or index + 1 == len(sessions):
                    for name in PROVIDERS:
                        rows.append(totals[name])
                        out.write(totals[name].markdown() + "\n")
                    out.flush()
                    if log is not None:
                        log(" / ".join(f"{r.provider} {r.hit_rate:.3f} {r.record_bytes:,} B"
                                       for r in rows[-2:]))
            last = f"s{len(sessions) - 1}"
            for store in stores.values():
                if store.get(last, namespace="bench").tokens != [
                        int(t) for t in sessions[-1].tokens]:
                    raise AssertionError("a store read back other tokens than it was given")
        out.write(f"\nLoad average (1, 5, 15 min): {header.finished().load()}.\n")
    return rows

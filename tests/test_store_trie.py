"""The store's hot tier is a radix trie (``seqkv.store.hot``, ``seqkv.trie.cache``): a put, an
append or a get finds in memory what this worker decoded or coded, without a decode (and, when
the trie holds every token, without an index request); what the trie evicted is found through
the backend's index again. Each test says which guard it needs and proves it with a mutant."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from seqkv.store import SessionStore, TokensCodec
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.chains import ChainDecoder
from seqkv.store.hot import HotMatch, HotTier
from seqkv.store.prefixes import PrefixMatcher

PROMPT = [3 + (7 * i) % 300 for i in range(40)]


def _store(tmp_path: Path, hot_bytes: int = 1 << 24, name: str = "store") -> SessionStore:
    return SessionStore(DirectoryBackend(tmp_path / name), lambda level: TokensCodec(512, level),
                        hot_bytes=hot_bytes)


def _count(monkeypatch: pytest.MonkeyPatch, calls: Counter[str]) -> None:
    """Count span decodes, index lookups and chain fetches from here on."""

    def counting(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return function(*args, **kwargs)
        return counted

    monkeypatch.setattr(ChainDecoder, "_decode_group",
                        counting("decode", ChainDecoder._decode_group))
    monkeypatch.setattr(DirectoryBackend, "lookup", counting("lookup", DirectoryBackend.lookup))
    monkeypatch.setattr(DirectoryBackend, "fetch_chain",
                        counting("fetch_chain", DirectoryBackend.fetch_chain))


def _hit_path(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Put a session, then: a put of a prefix of it, a put extending it, a get of it; the
    work each did."""
    store.put("a", [*PROMPT, 1, 2, 3], level="ngram", namespace="n")
    calls: Counter[str] = Counter()
    with monkeypatch.context() as patch:
        _count(patch, calls)
        short = store.put("p", PROMPT, level="ngram", namespace="n")
        assert short.shared_tokens == len(PROMPT) and short.record_bytes == 0
        longer = store.put("b", [*PROMPT, 1, 2, 3, 9, 9], level="ngram", namespace="n")
        assert longer.shared_tokens == len(PROMPT) + 3
        assert store.get("a", namespace="n").tokens == [*PROMPT, 1, 2, 3]
        assert store.get("b", namespace="n").tokens == [*PROMPT, 1, 2, 3, 9, 9]
    return calls


def test_a_trie_hit_decodes_nothing_and_a_full_hit_asks_no_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _hit_path(_store(tmp_path), monkeypatch)
    # one lookup: the put extending "a" (its new span sets index keys); the prefix's put asks
    # none; one chain fetch: the prefix's row binds its span's KV digest
    assert calls == {"lookup": 1, "fetch_chain": 1}, calls


def test_without_the_trie_the_same_calls_decode(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the trie answers nothing (as the old keyed hot tier did by tokens): the full hit
    asks the index, and the gets decode."""
    monkeypatch.setattr(HotTier, "match", lambda self, root, tokens: HotMatch(0, None, None))
    monkeypatch.setattr(HotTier, "state", lambda self, root, span: None)
    calls = _hit_path(_store(tmp_path), monkeypatch)
    assert calls["lookup"] == 2 and calls["decode"] >= 2, calls


def test_what_the_trie_evicted_is_found_through_the_index(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put("a", [*PROMPT, 1, 2, 3], level="ngram", namespace="n")
    assert store.hot.trie.evict(1 << 30) > 0 and store.hot.nbytes == 0
    result = store.put("b", [*PROMPT, 1, 2, 3, 4], level="ngram", namespace="n")
    assert result.shared_tokens == len(PROMPT) + 3 and result.candidates == 1
    assert store.hot.nbytes > 0  # the decoded candidate and the new chain entered the trie


def test_eviction_without_the_index_fallback_loses_the_prefix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the index's candidates are never tried, so after an eviction nothing matches."""
    from seqkv.store.prefixes import Match

    monkeypatch.setattr(PrefixMatcher, "match", lambda self, *a, **k: Match(0, None, 0))
    store = _store(tmp_path)
    store.put("a", [*PROMPT, 1, 2, 3], level="ngram", namespace="n")
    store.hot.trie.evict(1 << 30)
    assert store.put("b", [*PROMPT, 1, 2, 3, 4], level="ngram", namespace="n"
                     ).shared_tokens == 0


def test_the_trie_changes_what_is_found_not_what_is_written(tmp_path: Path) -> None:
    """The same puts on a store with the trie and on one without a hot tier write the same
    records and index entries, byte for byte (the index names the same parents here)."""
    puts = [("a", [*PROMPT, 1, 2, 3]), ("b", [*PROMPT, 1, 2, 3, 9]), ("c", PROMPT[:30]),
            ("d", [*PROMPT[:20], 5, 5])]

    def written(store: SessionStore, root: Path) -> dict[str, bytes]:
        for name, tokens in puts:
            store.put(name, tokens, level="ngram", namespace="n")
        store.append("a", [7, 7], namespace="n")
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and "records" in p.parts}

    hot = written(_store(tmp_path, name="hot"), tmp_path / "hot")
    cold = written(_store(tmp_path, hot_bytes=0, name="cold"), tmp_path / "cold")
    assert hot == cold and len(hot) == 4


def test_a_deleted_prefix_found_in_the_trie_is_forgotten_and_the_put_retried(
        tmp_path: Path) -> None:
    """Another worker deletes the chain this worker holds: the commit names the parent gone,
    the trie drops every chain through it, and the put codes from the first token."""
    store = _store(tmp_path)
    other = _store(tmp_path)
    store.put("a", [*PROMPT, 1], level="ngram", namespace="n")
    other.delete("a", namespace="n")
    result = store.put("b", [*PROMPT, 2], level="ngram", namespace="n")
    assert result.shared_tokens == 0
    assert store.get("b", namespace="n").tokens == [*PROMPT, 2]
    assert store.hot.trie.sizes().protected_bytes == 0  # every lock was released


def _protected_while_coding(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> int:
    """The trie's protected bytes while a put that matched in the trie codes and commits."""
    seen: list[int] = []
    code = SessionStore._code_and_commit

    def watched(self: SessionStore, coding: Any) -> Any:
        seen.append(self.hot.sizes().protected_bytes)
        return code(self, coding)

    store.put("a", [*PROMPT, 1, 2, 3], level="ngram", namespace="n")
    monkeypatch.setattr(SessionStore, "_code_and_commit", watched)
    store.put("b", [*PROMPT, 1, 2, 3, 9], level="ngram", namespace="n")
    assert store.hot.sizes().protected_bytes == 0  # released after the commit
    return seen[0]


def test_an_in_flight_put_locks_the_path_it_matched(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert _protected_while_coding(_store(tmp_path), monkeypatch) >= 8 * (len(PROMPT) + 3)


def test_the_lock_test_catches_a_put_that_does_not_lock(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HotTier, "lock", lambda self, node: None)
    monkeypatch.setattr(HotTier, "unlock", lambda self, node: None)
    assert _protected_while_coding(_store(tmp_path), monkeypatch) == 0


def test_an_exact_prefix_of_an_inexact_chain_is_exact_in_the_trie() -> None:
    """A trie node's source may be a longer chain (a split keeps the child's source): the KV of a
    cut is exact when every span before the cut is, whatever the chain's later spans are."""
    from seqkv.store.hot import ChainState, HotTier
    from seqkv.store.ids import NamespaceKey, SpanId

    tier = HotTier(capacity_bytes=1 << 20)
    root = ("s", NamespaceKey(b"n"))
    kv = torch.zeros(1, 2, 1, 12, 2)
    # span 1 holds tokens 0..7 exactly; span 2 continues it to 12 tokens, not exactly
    tier.put(root, ChainState(tuple(range(12)), kv, 8, ((SpanId(1), 0), (SpanId(2), 8))))
    prefix = tier.match(root, list(range(8)))
    assert prefix.length == 8 and prefix.state is not None
    assert prefix.state.kv_exact
    whole = tier.match(root, list(range(12)))
    assert whole.state is not None and not whole.state.kv_exact
    assert whole.state.exact_until(8) and not whole.state.exact_until(9)


def test_the_exactness_test_catches_a_flag_read_for_the_whole_chain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import seqkv.store.hot as hot

    monkeypatch.setattr(hot, "inexact_until", lambda inexact_from, length: inexact_from)
    with pytest.raises(AssertionError):
        test_an_exact_prefix_of_an_inexact_chain_is_exact_in_the_trie()

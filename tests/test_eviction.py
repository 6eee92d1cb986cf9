"""The eviction ledger: its sizes, references and order against a brute-force model, the guards
each shown failing on a mutant, and the byte-bounded LRU map built on it."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import seqkv.eviction as eviction
from seqkv.errors import EvictionConfigError
from seqkv.eviction import ByteLRU, EvictionLedger, make_policy

KEYS = st.sampled_from("abcdef")


def test_doctests() -> None:
    result = doctest.testmod(eviction)
    assert result.attempted > 0 and result.failed == 0


class _Model:
    """One entry as the brute-force model sees it."""

    def __init__(self, nbytes: int, tokens: int) -> None:
        self.nbytes, self.tokens = nbytes, tokens
        self.refs = 0
        self.rank: float | None = None
        self.order = 0  # when it last took its place in the order
        self.eligible = True


class LedgerMachine(RuleBasedStateMachine):
    """Every operation on a ledger and on a dict of entries; evictions must agree key for key,
    and sizes after every step (invariants 1-5 of ``seqkv.eviction``)."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, _Model] = {}
        self.ledger: EvictionLedger[str] = EvictionLedger(
            budget_bytes=40, eligible=lambda key: self.model[key].eligible)
        self.clock = 0
        self.moves = 0

    def _place(self, entry: _Model) -> None:
        self.moves += 1
        entry.order = self.moves
        if entry.refs == 0 and entry.eligible and entry.rank is not None:  # a push: invariant 4
            assert self.ledger.queued <= 2 * len(self.ledger) + 64

    @rule(key=KEYS, nbytes=st.integers(0, 20), tokens=st.integers(0, 5))
    def add(self, key: str, nbytes: int, tokens: int) -> None:
        if key in self.model:
            return
        self.ledger.add(key, nbytes, tokens)
        self.model[key] = _Model(nbytes, tokens)

    @rule(key=KEYS)
    def remove(self, key: str) -> None:
        if key in self.model:
            self.ledger.remove(key)
            del self.model[key]

    @rule(key=KEYS, nbytes=st.integers(0, 20), tokens=st.integers(0, 5))
    def resize(self, key: str, nbytes: int, tokens: int) -> None:
        if key in self.model:
            self.ledger.resize(key, nbytes, tokens)
            self.model[key].nbytes, self.model[key].tokens = nbytes, tokens

    @rule(key=KEYS)
    def lock(self, key: str) -> None:
        if key in self.model:
            entry = self.model[key]
            assert self.ledger.lock(key) == (entry.refs == 0)
            entry.refs += 1

    @rule(key=KEYS)
    def unlock(self, key: str) -> None:
        if key in self.model and self.model[key].refs:
            entry = self.model[key]
            entry.refs -= 1
            assert self.ledger.unlock(key) == (entry.refs == 0)
            if entry.refs == 0:
                self._place(entry)

    @rule(key=KEYS)
    def touch(self, key: str) -> None:
        if key in self.model:
            self.ledger.touch(key)
            self.clock += 1
            self.model[key].rank = float(self.clock)
            self._place(self.model[key])

    @rule(key=KEYS, priority=st.integers(-3, 3))
    def rank(self, key: str, priority: int) -> None:
        if key in self.model:
            self.ledger.rank(key, float(priority))
            self.model[key].rank = float(priority)
            self._place(self.model[key])

    @rule(key=KEYS, priority=st.integers(-3, 3))
    def flip_eligibility(self, key: str, priority: int) -> None:
        """The owner's condition changes; an owner ranks an entry that becomes eligible."""
        if key in self.model:
            entry = self.model[key]
            entry.eligible = not entry.eligible
            if entry.eligible:
                self.rank(key, priority)

    def _model_evict(self, num_bytes: int) -> tuple[list[str], int]:
        evicted, freed = [], 0
        while freed < num_bytes:
            candidates = [(e.rank, e.order, k) for k, e in self.model.items()
                          if e.refs == 0 and e.eligible and e.rank is not None]
            if not candidates:
                break
            _, _, key = min(candidates)
            freed += self.model.pop(key).nbytes
            evicted.append(key)
        return evicted, freed

    @rule(num_bytes=st.integers(0, 50))
    def evict(self, num_bytes: int) -> None:
        assert self.ledger.evict(num_bytes) == self._model_evict(num_bytes)

    @rule()
    def evict_to_budget(self) -> None:
        excess = sum(e.nbytes for e in self.model.values()) - 40
        expected, freed = self._model_evict(excess) if excess > 0 else ([], 0)
        assert self.ledger.evict_to_budget() == (expected, freed >= excess)

    @invariant()
    def sizes_match_the_model(self) -> None:
        sizes = self.ledger.sizes()
        held = self.model.values()
        assert sizes.entries == len(self.model) == len(self.ledger)
        assert sizes.protected_bytes == sum(e.nbytes for e in held if e.refs)
        assert sizes.evictable_bytes == sum(e.nbytes for e in held if not e.refs)
        assert sizes.protected_tokens == sum(e.tokens for e in held if e.refs)
        assert sizes.evictable_tokens == sum(e.tokens for e in held if not e.refs)
        assert all(self.ledger.refs(k) == e.refs for k, e in self.model.items())


TestLedgerMachine = LedgerMachine.TestCase


def _lru_of_three() -> EvictionLedger[str]:
    ledger: EvictionLedger[str] = EvictionLedger()
    for key in "abc":
        ledger.add(key, 1)
        ledger.touch(key)
    return ledger


def _locked_entry_survives() -> bool:
    ledger = _lru_of_three()
    ledger.lock("a")
    ledger.rank("a", 0.0)  # ranked first while locked: still not a candidate
    return ledger.evict(3) == (["b", "c"], 2)


def test_a_locked_entry_is_never_evicted() -> None:
    assert _locked_entry_survives()


def test_mutant_that_ignores_references_evicts_a_locked_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EvictionLedger, "_candidate", lambda self, key, entry: True)
    assert not _locked_entry_survives()


def _ineligible_entry_survives() -> bool:
    barred = {"a"}
    ledger: EvictionLedger[str] = EvictionLedger(eligible=lambda key: key not in barred)
    for key in "abc":
        ledger.add(key, 1)
        ledger.touch(key)
    return ledger.evict(3) == (["b", "c"], 2)


def test_an_ineligible_entry_is_never_evicted() -> None:
    assert _ineligible_entry_survives()


def test_mutant_that_ignores_eligibility_evicts_an_ineligible_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EvictionLedger, "_candidate", lambda self, key, entry: entry.refs == 0)
    assert not _ineligible_entry_survives()


def _touch_moves_an_entry_back() -> bool:
    ledger = _lru_of_three()
    ledger.touch("a")  # a's first place is stale now
    return ledger.evict(1) == (["b"], 1)


def test_a_stale_place_in_the_order_is_skipped() -> None:
    assert _touch_moves_an_entry_back()


def test_mutant_that_keeps_stale_places_evicts_by_an_old_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def live(self: EvictionLedger[str], key: str, sequence: int) -> bool:
        entry = self._entries.get(key)
        return entry is not None and self._candidate(key, entry)

    monkeypatch.setattr(EvictionLedger, "_live", live)
    assert not _touch_moves_an_entry_back()


def _heap_after_touches() -> int:
    ledger = _lru_of_three()
    for _ in range(1000):
        ledger.touch("a")
    return ledger.queued


def test_the_heap_stays_bounded_under_many_touches() -> None:
    assert _heap_after_touches() <= 2 * 3 + 64


def test_mutant_without_compaction_grows_the_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eviction, "_HEAP_SLACK", 10**9)
    assert _heap_after_touches() > 2 * 3 + 64


def test_unlock_returns_an_entry_at_its_last_rank() -> None:
    ledger = _lru_of_three()
    ledger.lock("a")
    ledger.touch("b")
    ledger.unlock("a")  # a keeps its rank: still the least recently used
    assert ledger.evict(1) == (["a"], 1)


def test_ties_go_to_the_entry_ranked_first() -> None:
    ledger: EvictionLedger[str] = EvictionLedger()
    for key in "cab":
        ledger.add(key, 1)
        ledger.rank(key, 0.0)
    assert ledger.evict(3) == (["c", "a", "b"], 3)


def test_an_unranked_entry_has_no_place_in_the_order() -> None:
    ledger: EvictionLedger[str] = EvictionLedger(budget_bytes=0)
    ledger.add("a", 5)
    assert ledger.evict_to_budget() == ([], False)
    assert ledger.sizes().evictable_bytes == 5


def test_evict_stops_once_enough_is_freed() -> None:
    ledger = _lru_of_three()
    assert ledger.evict(0) == ([], 0)
    assert ledger.evict(1) == (["a"], 1)


def test_on_evict_may_rank_another_entry() -> None:
    """As the trie does: a parent becomes a candidate when its last child goes."""
    children = {"parent": {"child"}}
    ledger: EvictionLedger[str] = EvictionLedger(eligible=lambda key: not children.get(key))
    for key in ("parent", "child"):
        ledger.add(key, 1)
        ledger.touch(key)

    def gone(key: str) -> None:
        if key == "child":
            children["parent"].discard(key)
            ledger.rank("parent", 0.0)

    assert ledger.evict(2, gone) == (["child", "parent"], 2)


def test_misuse_is_an_internal_error() -> None:
    ledger: EvictionLedger[str] = EvictionLedger()
    ledger.add("a", 1)
    with pytest.raises(AssertionError, match="already held"):
        ledger.add("a", 1)
    with pytest.raises(AssertionError, match="holds no reference"):
        ledger.unlock("a")
    with pytest.raises(AssertionError, match="not held"):
        ledger.touch("b")


def test_a_changed_budget_applies_at_the_next_eviction() -> None:
    ledger = _lru_of_three()
    ledger.budget_bytes = 1
    assert ledger.evict_to_budget() == (["a", "b"], True)


def test_unknown_policy_name() -> None:
    with pytest.raises(EvictionConfigError, match="unknown eviction policy"):
        make_policy("mru")  # type: ignore[arg-type]


def test_byte_lru_keeps_its_capacity_and_counts_hits() -> None:
    cache: ByteLRU[str, bytes] = ByteLRU(10, len)
    cache.put("a", b"12345")
    cache.put("b", b"12345")
    assert cache.get("a") == b"12345"  # b is now the least recently used
    cache.put("c", b"1")
    assert (cache.get("b"), len(cache), cache.nbytes) == (None, 2, 6)
    assert (cache.hits, cache.misses) == (1, 1)


def test_byte_lru_refuses_an_entry_larger_than_its_capacity() -> None:
    cache: ByteLRU[str, bytes] = ByteLRU(4, len)
    cache.put("a", b"1234")
    cache.put("a", b"12345")  # not kept; the old value stays
    assert cache.get("a") == b"1234"


def test_byte_lru_replaces_and_discards() -> None:
    cache: ByteLRU[str, bytes] = ByteLRU(10, len)
    cache.put("a", b"12")
    cache.put("a", b"1234")
    assert cache.nbytes == 4
    cache.discard("a")
    cache.discard("a")
    assert (len(cache), cache.nbytes) == (0, 0)

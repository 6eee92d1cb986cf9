"""Trie snapshots are retired (``seqkv.trie.persistence``): a snapshot of either format, written
by the last writer (``tests/data/legacy/trie-v1.trie``, ``trie-v2.trie``), is refused by name
with how to rebuild it; other bytes keep their own errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import seqkv.trie.persistence as persistence
from seqkv.errors import EmptyInputError, SeqKVError
from seqkv.trie import NotATrieFileError, TrieSnapshotRetiredError, load_trie, trie_from_bytes

LEGACY = Path(__file__).parent / "data" / "legacy"
SNAPSHOTS = ["trie-v1.trie", "trie-v2.trie"]


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_a_snapshot_is_refused_by_name_with_how_to_rebuild(name: str) -> None:
    with pytest.raises(TrieSnapshotRetiredError, match="put them into a store"):
        load_trie(LEGACY / name)
    with pytest.raises(TrieSnapshotRetiredError):
        trie_from_bytes((LEGACY / name).read_bytes())
    assert issubclass(TrieSnapshotRetiredError, SeqKVError)


def test_other_bytes_keep_their_errors() -> None:
    with pytest.raises(EmptyInputError):
        trie_from_bytes(b"")
    with pytest.raises(NotATrieFileError):
        trie_from_bytes((LEGACY / "v2-tokens.skv").read_bytes())


def test_the_refusal_test_catches_a_reader_that_does_not_know_the_magic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the snapshot check answers no; a snapshot is then not refused as retired."""
    monkeypatch.setattr(persistence, "is_trie_snapshot", lambda data: False)
    with pytest.raises(NotATrieFileError):
        trie_from_bytes((LEGACY / "trie-v2.trie").read_bytes())


def test_nothing_writes_a_snapshot() -> None:
    import seqkv.trie as trie

    assert not any(hasattr(trie, name) for name in ("save_trie", "trie_to_bytes"))
    assert not hasattr(trie.PrefixTrie, "snapshot")

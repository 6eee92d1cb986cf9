"""The warm tier's storage: one file per block under a folder, a byte budget, LRU eviction.

Motivation: the scheduler side asks only "is this key here?" (a ``stat``), the worker side reads
and writes entries; both may run in different processes, so the folder is the shared state and
each process keeps its own view of it. Entries are written to a temporary name and renamed, so a
reader sees a whole entry or none.

Eviction (``evict``): least recently used first (written or loaded by this process; entries
found on disk at start count by their modification time), never a key in ``protected`` (the
keys the scheduler has pinned between a match and its load: locked in the tier's
``seqkv.eviction.EvictionLedger`` for the call), until the folder's bytes are within the budget.

Invariants:
1. ``read`` returns the bytes a ``write`` of that key stored, or ``None``; it never returns part
   of an entry (enforced: atomic rename).
2. After ``evict(protected)``, the tracked bytes are within the budget unless every remaining
   entry is protected (enforced; checked by a test).
3. A protected key is never deleted by ``evict`` (enforced).
4. Keys are hex file names of fixed length; nothing else in the folder is touched (enforced).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from seqkv.eviction import EvictionLedger

_SUFFIX = ".skw"


class WarmTier:
    """A folder of warm entries with a byte budget (see the module docstring)."""

    def __init__(self, folder: str | Path, budget_bytes: int) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._ledger: EvictionLedger[bytes] = EvictionLedger(budget_bytes=budget_bytes)
        """Tracked entries: their sizes and their LRU order."""
        self.evicted = 0
        found = []
        for path in self.folder.glob(f"*{_SUFFIX}"):
            try:
                key = bytes.fromhex(path.stem)
                stat = path.stat()
            except (ValueError, OSError):
                continue
            found.append((stat.st_mtime_ns, key, stat.st_size))
        for _, key, size in sorted(found):
            self._track(key, size)

    @property
    def budget_bytes(self) -> int:
        budget = self._ledger.budget_bytes
        assert budget is not None  # the ledger is made and changed with an int only
        return budget

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self._ledger.budget_bytes = value

    def path(self, key: bytes) -> Path:
        return self.folder / f"{key.hex()}{_SUFFIX}"

    def contains(self, key: bytes) -> bool:
        """Whether an entry is on disk for ``key`` (no side effect)."""
        return self.path(key).is_file()

    def read(self, key: bytes) -> bytes | None:
        try:
            data = self.path(key).read_bytes()
        except OSError:
            return None
        if key in self._ledger:
            self._ledger.touch(key)
        else:
            self._track(key, len(data))
        return data

    def write(self, key: bytes, data: bytes) -> None:
        target = self.path(key)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, target)
        if key in self._ledger:
            self._ledger.resize(key, len(data), 0)
            self._ledger.touch(key)
        else:
            self._track(key, len(data))

    def delete(self, key: bytes) -> None:
        self.path(key).unlink(missing_ok=True)
        if key in self._ledger:
            self._ledger.remove(key)

    @property
    def tracked_bytes(self) -> int:
        return self._ledger.total_bytes

    def evict(self, protected: Collection[bytes] = ()) -> int:
        """Delete least recently used unprotected entries until within the budget; return how
        many were deleted."""
        held = [key for key in set(protected) if key in self._ledger]
        for key in held:
            self._ledger.lock(key)
        try:
            deleted, _ = self._ledger.evict_to_budget()
        finally:
            for key in held:
                self._ledger.unlock(key)
        for key in deleted:
            self.path(key).unlink(missing_ok=True)
        self.evicted += len(deleted)
        return len(deleted)

    def _track(self, key: bytes, size: int) -> None:
        """Account ``key`` as the most recently used entry."""
        self._ledger.add(key, size)
        self._ledger.touch(key)

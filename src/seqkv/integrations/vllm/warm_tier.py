"""The warm tier's storage: one file per block under a folder, a byte budget, LRU eviction.

Motivation: the scheduler side asks only "is this key here?" (a ``stat``), the worker side reads
and writes entries; both may run in different processes, so the folder is the shared state and
each process keeps its own view of it. Entries are written to a temporary name and renamed, so a
reader sees a whole entry or none.

Eviction (``evict``): least recently used first (written or loaded by this process; entries
found on disk at start count by their modification time), never a key in ``protected`` (the
keys the scheduler has pinned between a match and its load), until the folder's bytes are within
the budget.

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
from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path

_SUFFIX = ".skw"


class WarmTier:
    """A folder of warm entries with a byte budget (see the module docstring)."""

    def __init__(self, folder: str | Path, budget_bytes: int) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.budget_bytes = budget_bytes
        self._sizes: OrderedDict[bytes, int] = OrderedDict()
        """Tracked entries, least recently used first."""
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
            self._sizes[key] = size

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
        if key in self._sizes:
            self._sizes.move_to_end(key)
        else:
            self._sizes[key] = len(data)
        return data

    def write(self, key: bytes, data: bytes) -> None:
        target = self.path(key)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, target)
        self._sizes[key] = len(data)
        self._sizes.move_to_end(key)

    def delete(self, key: bytes) -> None:
        self.path(key).unlink(missing_ok=True)
        self._sizes.pop(key, None)

    @property
    def tracked_bytes(self) -> int:
        return sum(self._sizes.values())

    def evict(self, protected: Collection[bytes] = ()) -> int:
        """Delete least recently used unprotected entries until within the budget; return how
        many were deleted."""
        total = self.tracked_bytes
        deleted = 0
        for key in list(self._sizes):
            if total <= self.budget_bytes:
                break
            if key in protected:
                continue
            total -= self._sizes[key]
            self.delete(key)
            deleted += 1
        self.evicted += deleted
        return deleted

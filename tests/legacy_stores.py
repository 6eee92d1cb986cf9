"""The committed store of schema 1 (``tests/data/store-v1``, written by the release before store
schema 2: rows without bindings, span records of version 1), as a directory and rebuilt on Redis
in the key layout that release wrote (``P:meta`` without a schema, rows ``<span>:<length>``).

``model`` holds sessions a to d of ``tiny_random_llama(seed=0)`` in namespace "n"; ``tokens``
holds p and q of the tokens-only codec (``TokensCodec(512)``, level ``plain``). What each session
holds is in ``tokens.json``.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

STORE_V1 = Path(__file__).parent / "data" / "store-v1"
STORE_V1_TOKENS: dict[str, list[int]] = json.loads((STORE_V1 / "tokens.json").read_text())


def directory_store_v1(folder: Path, part: str) -> Path:
    """A copy of the committed store's ``part`` ("model" or "tokens") under ``folder``."""
    shutil.copytree(STORE_V1 / part, folder / part)
    return folder / part


def redis_store_v1(client: Any, prefix: str, part: str) -> None:
    """The committed store's ``part`` written under ``prefix`` as that release laid it out on
    Redis: the same codecs, spans, records, counts, rows, index and dictionaries."""
    root = STORE_V1 / part
    db = sqlite3.connect(f"file:{root / 'store.sqlite3'}?mode=ro", uri=True)
    try:
        for key, value in db.execute("SELECT k, v FROM meta"):
            client.hset(f"{prefix}:meta", key, value)
        for index, digest, description in db.execute(
                "SELECT idx, digest, description FROM codecs"):
            client.hset(f"{prefix}:codecs", index, description)
            client.hset(f"{prefix}:codecidx", digest, index)
            client.set(f"{prefix}:codecn", index)
        for span, ns, count in db.execute("SELECT id, ns, refcount FROM spans ORDER BY id"):
            keys = f"{prefix}:{bytes(ns).hex()}"
            record = (root / "records" / f"{span % 256:02x}" / f"{span:x}").read_bytes()
            client.set(f"{keys}:s:{span}", record)
            client.hset(f"{keys}:c", span, count)
            client.set(f"{keys}:id", span)
        for ns, name, span, length in db.execute("SELECT ns, name, span, length FROM sessions"):
            client.hset(f"{prefix}:{bytes(ns).hex()}:n", name, f"{span}:{length}")
        for ns, key, span in db.execute("SELECT ns, key, span FROM idx"):
            client.hset(f"{prefix}:{bytes(ns).hex()}:i:{bytes(key)[:2].hex()}", bytes(key)[2:],
                        span)
        for ns, digest, data in db.execute("SELECT ns, digest, data FROM dicts"):
            client.set(f"{prefix}:{bytes(ns).hex()}:d:{digest}", bytes(data))
        for ns, digest in db.execute("SELECT ns, digest FROM dict_current"):
            client.set(f"{prefix}:{bytes(ns).hex()}:dcur", digest)
        for span, ns, digest in db.execute("SELECT span, ns, digest FROM span_dicts"):
            client.hset(f"{prefix}:{bytes(ns).hex()}:sd", span, digest)
    finally:
        db.close()

"""A span record as a store holds it, read or replaced in place on either backend: what the
damage tests forge (tests/test_store_integrity.py, tests/test_work_bounds.py)."""

from __future__ import annotations

from seqkv.store import SessionStore
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.backends.redis import RedisBackend
from seqkv.store.ids import check_namespace, namespace_key


def record_bytes(store: SessionStore, span: int, data: bytes | None = None,
                 namespace: str = "n") -> bytes:
    """Span ``span``'s record as stored (replaced by ``data`` first, if given)."""
    backend = store.backend
    if isinstance(backend, DirectoryBackend):
        if data is not None:
            backend._path(span).write_bytes(data)
        return backend._path(span).read_bytes()
    assert isinstance(backend, RedisBackend)
    key = f"{backend._ns(namespace_key(check_namespace(namespace)))}:s:{span}"
    if data is not None:
        backend.client.set(key, data)
    return bytes(backend.client.get(key))

"""The mixing dictionaries of each namespace (``seqkv.mixing``), kept by digest.

``put`` stores a dictionary under its digest and makes it the namespace's current one; a span
coded at a mixing level (``portable+mix``) codes with the namespace's current dictionary and
names its digest; decoding looks the digest up in the span's own namespace only.

Invariants:
1. A dictionary built for another namespace is refused (``DictionaryNamespaceError``), so one
   tenant's dictionary never codes another's sessions (enforced).
2. A digest missing from the asked namespace raises ``DictionaryUnavailableError`` with the
   message a digest stored nowhere gets (enforced: ``missing``).
3. What ``get`` returns was checked against its digest and its namespace (enforced).

What mutates: ``put`` changes the backend; every read may fill this worker's cache (immutable,
content-addressed entries keyed by namespace and digest).
"""

from __future__ import annotations

from dataclasses import dataclass

from seqkv.eviction import ByteLRU
from seqkv.mixing.dictionary import Dictionary, DictionaryDigest
from seqkv.mixing.errors import CorruptDictionaryError, DictionaryUnavailableError
from seqkv.store.backends.base import StoreBackend
from seqkv.store.errors import DictionaryNamespaceError
from seqkv.store.ids import NamespaceKey, StoreNamespace, Tenant

# NOTE: 64 MiB holds ~30 dictionaries of the default policy's largest (2**20 tokens at 2 bytes).
DEFAULT_DICTIONARY_CACHE_BYTES = 64 << 20


def missing(digest: str) -> DictionaryUnavailableError:
    """The error for a span whose dictionary its namespace does not hold: one message, whether
    the digest exists in another namespace or nowhere (the store's tenant rule)."""
    return DictionaryUnavailableError(
        f"a stored span was coded with the mixing dictionary {digest[:16]}..., which its "
        "namespace does not hold: put that dictionary into the namespace again "
        "(SessionStore.put_dictionary; CLI: seqkv store dict-put DICT --namespace NS)")


@dataclass(frozen=True, slots=True)
class StoredDictionary:
    """A dictionary put into a namespace: now its current one."""

    digest: DictionaryDigest
    namespace: StoreNamespace
    tokens: int
    bytes: int
    created: bool  # False: the namespace already stored this digest (it is current again)


class NamespaceDictionaries:
    """The dictionaries every namespace of one store keeps, with this worker's cache."""

    def __init__(self, backend: StoreBackend,
                 cache_bytes: int = DEFAULT_DICTIONARY_CACHE_BYTES) -> None:
        self._backend = backend
        self._cache: ByteLRU[tuple[NamespaceKey, str], Dictionary] = ByteLRU(
            cache_bytes, lambda dictionary: dictionary.size_bytes)

    def put(self, tenant: Tenant, dictionary: Dictionary) -> StoredDictionary:
        if dictionary.namespace != tenant.name:
            raise DictionaryNamespaceError(
                f"the dictionary {str(dictionary.digest)[:16]}... was built for namespace "
                f"{dictionary.namespace!r}, not {tenant.name!r}: build it for this namespace "
                f"(seqkv dict build --namespace {tenant.name})")
        created = self._backend.put_dictionary(tenant.key, str(dictionary.digest),
                                               dictionary.to_bytes())
        return StoredDictionary(dictionary.digest, tenant.name, len(dictionary),
                                dictionary.size_bytes, created)

    def get(self, tenant: Tenant, digest: str) -> Dictionary | None:
        """The dictionary ``tenant`` stores under ``digest``, or None (invariant 3)."""
        key = (tenant.key, digest)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        data = self._backend.fetch_dictionary(tenant.key, digest)
        if data is None:
            return None
        dictionary = Dictionary.from_bytes(data, expected=DictionaryDigest(digest))
        if dictionary.namespace != tenant.name:
            raise CorruptDictionaryError(
                f"namespace {tenant.name!r} stores the dictionary {digest[:16]}... of namespace "
                f"{dictionary.namespace!r}: the store was altered outside seqkv")
        self._cache.put(key, dictionary)
        return dictionary

    def required(self, tenant: Tenant, digest: str) -> Dictionary:
        """``get``, or the tenant rule's one error (invariant 2)."""
        dictionary = self.get(tenant, digest)
        if dictionary is None:
            raise missing(digest)
        return dictionary

    def current(self, tenant: Tenant) -> Dictionary | None:
        """The namespace's current dictionary (None: none was put)."""
        digest = self._backend.current_dictionary(tenant.key)
        return None if digest is None else self.required(tenant, digest)

    def for_coding(self, tenant: Tenant, level: str) -> Dictionary:
        """The dictionary a put at a mixing ``level`` codes with: the current one."""
        dictionary = self.current(tenant)
        if dictionary is None:
            raise DictionaryUnavailableError(
                f"namespace {tenant.name!r} holds no mixing dictionary: put one first "
                f"(SessionStore.put_dictionary; CLI: seqkv store dict-put DICT --namespace "
                f"{tenant.name}), or store at a level that does not mix (not {level!r})")
        return dictionary

    def digests(self, tenant: Tenant) -> list[DictionaryDigest]:
        """The digests the namespace stores, sorted."""
        return [DictionaryDigest(d) for d in self._backend.dictionary_digests(tenant.key)]

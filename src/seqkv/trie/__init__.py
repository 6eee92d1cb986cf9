"""The prefix trie: layer 1 of arXiv 2604.15356, store each shared prefix's KV once.

Start with :class:`PrefixTrie` (insert, match, resolve, release, evict), :func:`prefix_hash` (the
content hash a ``.skv`` file uses to reference a stored prefix), :func:`trie_distance` (the trie
metric d_T), :func:`cluster_sessions` (the paper's clusters, reduced to what is sound),
and :class:`RadixCache` (a store worker's prefix index and hot tier: SGLang's prefix-cache
shape over the chains of stored spans). Both are one radix trie, ``seqkv.trie.core``, with
their own payload per node; eviction is ``seqkv.eviction``'s (its policies are re-exported
here); the trie's benchmark against vLLM-style hashed blocks lives outside the package
(``research.bench.trie``). The trie's own snapshot format is retired: the store's chain
of spans is its persistent form, and :func:`load_trie` refuses a snapshot by name
(``TrieSnapshotRetiredError``) with how to rebuild it.

Invariants:
1. Importing the package computes nothing and holds no mutable state (enforced: modules define
   classes, functions and constants only).
"""

from seqkv.eviction import (
    EvictionPolicy,
    EvictionPolicyName,
    LRUPolicy,
    ProbabilityWeightedPolicy,
    make_policy,
)
from seqkv.trie.cache import CacheMatch, RadixCache
from seqkv.trie.clusters import Cluster, ClusterReport, cluster_sessions, cluster_trie_sessions
from seqkv.trie.errors import (
    CorruptTrieFileError,
    InvalidLogProbsError,
    InvalidPrefixHashError,
    NotATrieFileError,
    PrefixHashMismatchError,
    PrefixNotFoundError,
    TrieError,
    TrieFileError,
    TrieSnapshotRetiredError,
    TruncatedTrieFileError,
    UnknownSessionError,
    UnsupportedTrieVersionError,
)
from seqkv.trie.inputs import KVLayout
from seqkv.trie.keys import (
    DEFAULT_NAMESPACE,
    Namespace,
    NodeId,
    PrefixHash,
    SessionId,
    prefix_hash,
)
from seqkv.trie.metric import Neighbor, prefix_probability, trie_distance
from seqkv.trie.persistence import load_trie, trie_from_bytes
from seqkv.trie.radix import (
    EvictedNode,
    EvictionResult,
    InsertResult,
    MatchResult,
    NodeInfo,
    PrefixTrie,
    ResolvedPrefix,
    SessionInfo,
    TrieAudit,
    TrieSizes,
    TrieStats,
)
from seqkv.trie.sequence import ScoredSequence

__all__ = [
    "DEFAULT_NAMESPACE",
    "CacheMatch",
    "Cluster",
    "ClusterReport",
    "CorruptTrieFileError",
    "EvictedNode",
    "EvictionPolicy",
    "EvictionPolicyName",
    "EvictionResult",
    "InsertResult",
    "InvalidLogProbsError",
    "InvalidPrefixHashError",
    "KVLayout",
    "LRUPolicy",
    "MatchResult",
    "Namespace",
    "Neighbor",
    "NodeId",
    "NodeInfo",
    "NotATrieFileError",
    "PrefixHash",
    "PrefixHashMismatchError",
    "PrefixNotFoundError",
    "PrefixTrie",
    "ProbabilityWeightedPolicy",
    "RadixCache",
    "ResolvedPrefix",
    "ScoredSequence",
    "SessionId",
    "SessionInfo",
    "TrieAudit",
    "TrieError",
    "TrieFileError",
    "TrieSizes",
    "TrieSnapshotRetiredError",
    "TrieStats",
    "TruncatedTrieFileError",
    "UnknownSessionError",
    "UnsupportedTrieVersionError",
    "cluster_sessions",
    "cluster_trie_sessions",
    "load_trie",
    "make_policy",
    "prefix_hash",
    "prefix_probability",
    "trie_distance",
    "trie_from_bytes",
]

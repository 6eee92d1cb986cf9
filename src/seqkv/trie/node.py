"""The nodes of the prefix trie: one edge of tokens, the KV of that span, and its bookkeeping.

Motivation: a serving trie holds many thousands of small nodes, so they are slotted dataclasses
(no per-instance ``__dict__``; a test checks it), and everything a query needs is a field. The
edge's tokens, its KV, depth, children and last access are the radix core's
(``seqkv.trie.core.RadixNode``); this node adds the edge's log2-probabilities, the cumulative
log2-probability from the namespace root, the content hash of the whole prefix ending here, and
hit statistics.

A node is the end of the prefix ``root .. node``; its edge holds the last ``len(tokens)`` tokens of
that prefix. Roots (one per namespace) hold no tokens.

Invariants (kept by ``PrefixTrie``, which owns every node; ``PrefixTrie.audit`` checks them):
1. ``depth == parent.depth + len(tokens)`` and ``path_log2_prob == parent.path_log2_prob +
   sum(log2_probs)`` up to float rounding (checked).
2. ``kv`` is ``None`` or ``[layers, 2, kv_heads, len(tokens), head_dim]`` (checked).
3. A node's references (the live sessions whose path runs through it) and its place in the
   eviction order are kept by the trie's ``seqkv.eviction.EvictionLedger``, not here (checked by
   ``PrefixTrie.audit``); roots are never counted.
4. A parent's ``children`` are keyed by each child's first token; no edge is empty except a
   root's (checked).
5. Nodes are never merged back after an eviction, so a prefix hash, once a node boundary, stays one
   until that node is evicted (enforced: ``seqkv.trie.core`` invariant 5).
6. The trie never writes into a node's ``kv`` tensor; a split replaces it with two new tensors
   (enforced: ``seqkv.trie.core`` invariant 6), so a tensor handed out stays valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from seqkv.trie.core import RadixNode
from seqkv.trie.keys import Namespace, NodeId, PrefixHash


@dataclass(slots=True, eq=False)
class TrieNode(RadixNode["TrieNode"]):
    """One node: the edge from its parent and the KV of that span (``seqkv.trie.core.RadixNode``),
    and the layer-1 bookkeeping.

    ``eq=False``: nodes compare and hash by identity, so they can sit in sets and dict keys.
    """

    node_id: NodeId = field(kw_only=True)
    namespace: Namespace = field(kw_only=True)
    log2_probs: npt.NDArray[np.float64] = field(kw_only=True)  # [edge]: log2 P(t_i | t_<i)
    path_log2_prob: float = field(kw_only=True)  # log2 P_M(prefix ending here)
    prefix_hash: PrefixHash = field(kw_only=True)
    nbytes: int = field(kw_only=True)  # KV bytes of the span, actual if kv is held, else nominal
    hit_count: int = field(default=0, kw_only=True)  # lookups whose path ran through this node
    created: int = field(default=0, kw_only=True)  # the logical clock when the node was created

    @property
    def surprisal_bits(self) -> float:
        """-log2 P_M(prefix ending here): d_T(s, s') of two sessions that diverge right here."""
        return -self.path_log2_prob

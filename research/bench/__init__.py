"""The measurements behind the reports: each layer of seqkv on a generated workload, and the
baselines it is measured against. They left the installed package (``src/seqkv``) because users
do not run them as a product; ``python -m research.bench`` runs them (``research.bench.cli``).

- ``decode``: bits per token and decode speed of every coding level (``reports/decode_levels.md``).
- ``mix``: a store dictionary and the exact mixer on a RAG-style workload (``reports/mixing.md``).
- ``store``: the session store on a multi-tenant chat workload, at scale, under faults.
- ``trie``: the prefix trie against ``hashed_blocks``, vLLM-style hashed blocks (the baseline).
- ``quant``, ``sweep``, ``distortion``: the per-vector quantizers' distortion on random unit
  vectors, and the rate-distortion sweep of predictive delta coding
  (``reports/rate_distortion.md``).
"""

"""The paper's bounds and ratios as symbolic derivations, each checked against the paper.

Paper: "Sequential KV Cache Compression via Probabilistic Language Tries: Beyond the Per-Vector
Shannon Limit", arXiv 2604.15356. Every number in it is a derivation; this package redoes each
one in sympy (exact rationals, no rounding) so the checker and the reports can show the paper's
value, the derived value and the verdict side by side (``paper_claims``).

Claims, and the module that checks each:

1. Per-vector bits per token position, 2 x layers x KV heads x head dim x bits = 3,932,160 for the
   paper's 70B geometry at 3 bits; the ratio over 4.3 sequential bits, ~914,000x, and ~914x with
   a 1000x overhead; the same with the 8 KV heads a grouped-query 70B model stores (~114,307x);
   the claim that the ratio grows with context: ``ratios``.
2. "About 80 GB" of fp16 KV for a 70B model at 128K context (arithmetic: 335.5 GB with 64 KV
   heads, 41.9 GB with 8; inconsistent with both): ``memory``.
3. The sequential bound as log2(perplexity), 3.32 bits at perplexity 10 and 4.32 at 20, and why
   that is a cross-entropy: ``perplexity`` (numeric entropies in ``information``).
4. Lemma 1 (determinism) and Theorem 1, H(KV_{i+1} | KV_{<=i}) <= H(t_{i+1} | t_{<=i}), as a
   chain of steps with named premises, plus a numeric check on synthetic sources: ``theorem1``.
5. The prefix layer's storage corollary, 1 - f (1 - l/n), and a variant that stores each shared
   prefix once: ``storage``.

Invariants:

1. (enforced) Importing the package computes nothing and holds no mutable state: symbols, frozen
   geometries and paper constants only; every result is computed when a function is called.
2. (checked) Each derived number is a substitution into the module's sympy expression.
"""

from seqkv.types import KVGeometry

from .claims import Claim, Measurements, paper_claims
from .information import (
    conditional_entropy_bits,
    cross_entropy_bits,
    entropy_bits,
    injective_on_support,
    is_injective,
    push_forward,
)
from .memory import (
    KVMemoryFigure,
    MemoryClaimCheck,
    check_paper_memory_claim,
    implied_kv_heads,
    kv_cache_bytes,
    kv_cache_bytes_expr,
    kv_memory_figure,
)
from .perplexity import (
    PerplexityBound,
    bits_per_token,
    bits_per_token_expr,
    bits_per_token_float,
    perplexity_bound,
    perplexity_for_bits,
)
from .ratios import (
    LLAMA_70B_GQA,
    PAPER_70B,
    SMOLLM2_135M,
    RatioResult,
    components_per_token,
    components_per_token_expr,
    fp16_bits_per_token,
    gqa_70b_ratio,
    paper_ratio,
    per_vector_bits_expr,
    per_vector_bits_per_token,
    per_vector_over_sequential,
    ratio,
    ratio_decreases_in_h,
    ratio_expr,
    sequential_bits_per_component,
)
from .storage import (
    StorageDerivation,
    derive_relative_storage,
    relative_storage,
    relative_storage_expr,
    relative_storage_float,
    relative_storage_with_prefix,
    relative_storage_with_prefix_expr,
)
from .theorem1 import (
    Premise,
    PremiseSpec,
    ProofStep,
    Relation,
    Theorem,
    Theorem1Check,
    check_data_processing,
    check_theorem1,
    premise_spec,
    premise_specs,
    proof_steps,
    theorem1_proof,
)

__all__ = [
    "LLAMA_70B_GQA",
    "PAPER_70B",
    "SMOLLM2_135M",
    "Claim",
    "KVGeometry",
    "KVMemoryFigure",
    "Measurements",
    "MemoryClaimCheck",
    "PerplexityBound",
    "Premise",
    "PremiseSpec",
    "ProofStep",
    "RatioResult",
    "Relation",
    "StorageDerivation",
    "Theorem",
    "Theorem1Check",
    "bits_per_token",
    "bits_per_token_expr",
    "bits_per_token_float",
    "check_data_processing",
    "check_paper_memory_claim",
    "check_theorem1",
    "components_per_token",
    "components_per_token_expr",
    "conditional_entropy_bits",
    "cross_entropy_bits",
    "derive_relative_storage",
    "entropy_bits",
    "fp16_bits_per_token",
    "gqa_70b_ratio",
    "implied_kv_heads",
    "injective_on_support",
    "is_injective",
    "kv_cache_bytes",
    "kv_cache_bytes_expr",
    "kv_memory_figure",
    "paper_claims",
    "paper_ratio",
    "per_vector_bits_expr",
    "per_vector_bits_per_token",
    "per_vector_over_sequential",
    "perplexity_bound",
    "perplexity_for_bits",
    "premise_spec",
    "premise_specs",
    "proof_steps",
    "push_forward",
    "ratio",
    "ratio_decreases_in_h",
    "ratio_expr",
    "relative_storage",
    "relative_storage_expr",
    "relative_storage_float",
    "relative_storage_with_prefix",
    "relative_storage_with_prefix_expr",
    "sequential_bits_per_component",
    "theorem1_proof",
]

"""Benchmarks and deterministic figures: what ``seqkv bench ...`` runs and CI gates."""

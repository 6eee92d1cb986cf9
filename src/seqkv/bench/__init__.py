"""Benchmarks that measure seqkv on generated workloads."""

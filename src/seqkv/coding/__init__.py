"""Entropy coding: the exact arithmetic coder for tokens, and the residual coder for KV."""

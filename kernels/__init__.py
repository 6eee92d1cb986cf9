"""Triton kernels for seqkv's hot paths, each beside its pure-torch reference (planned: issue 6).

Nothing is dispatched from here yet: every seqkv code path runs its torch reference.
"""

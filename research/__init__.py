"""The lab: prototypes and probes that measured seqkv's design, kept runnable outside the package.

Nothing in ``src/seqkv`` imports from here. See ``research/README.md``.
"""

"""seqkv: a KV cache stored as its token stream coded under the model, plus a coded residual.

Implements and measures arXiv 2604.15356 ("Sequential KV Cache Compression via Probabilistic
Language Tries"). Start with ``seqkv.compress`` / ``seqkv.decompress``; ``level=`` picks the
rate-compute dial (``seqkv.levels``, ``seqkv.parse_level``), ``seqkv.decompress_batch`` decodes
many files together.

The names below are imported on first use, so that ``import seqkv.formats.skv`` (reading,
inspecting or upgrading a file) does not load torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from seqkv.errors import SeqKVError
from seqkv.version import __version__

if TYPE_CHECKING:
    from seqkv.codec import (
        DEFAULT_TOLERANCE,
        CodingTrace,
        CompressResult,
        CompressStats,
        DecompressResult,
        DecompressStats,
        compress,
        decompress,
        decompress_batch,
        decompress_tokens,
    )
    from seqkv.levels import CodingLevel, LevelSpec, parse_level

_LAZY = {
    "DEFAULT_TOLERANCE": "seqkv.codec",
    "CodingTrace": "seqkv.codec",
    "CompressResult": "seqkv.codec",
    "CompressStats": "seqkv.codec",
    "DecompressResult": "seqkv.codec",
    "DecompressStats": "seqkv.codec",
    "compress": "seqkv.codec",
    "decompress": "seqkv.codec",
    "decompress_batch": "seqkv.codec",
    "decompress_tokens": "seqkv.codec",
    "CodingLevel": "seqkv.levels",
    "LevelSpec": "seqkv.levels",
    "parse_level": "seqkv.levels",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'seqkv' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_TOLERANCE",
    "CodingLevel",
    "CodingTrace",
    "CompressResult",
    "CompressStats",
    "DecompressResult",
    "DecompressStats",
    "LevelSpec",
    "SeqKVError",
    "__version__",
    "compress",
    "decompress",
    "decompress_batch",
    "decompress_tokens",
    "parse_level",
]

"""seqkv: a KV cache stored as its token stream coded under the model, plus a coded residual.

Implements and measures arXiv 2604.15356 ("Sequential KV Cache Compression via Probabilistic
Language Tries"). Start with ``seqkv.compress`` / ``seqkv.decompress`` (the ``.skv`` file API,
``seqkv.skv``, over the codec of coded sessions, ``seqkv.codec``); ``level=`` picks the
rate-compute dial (``seqkv.levels``, ``seqkv.parse_level``), ``seqkv.decompress_batch`` decodes
many files together, ``seqkv.upgrade`` rewrites an old file without re-coding it.

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
        DecompressResult,
        DecompressStats,
    )
    from seqkv.levels import CodingLevel, LevelSpec, parse_level
    from seqkv.skv import (
        CompressResult,
        CompressStats,
        compress,
        decompress,
        decompress_batch,
        decompress_tokens,
        upgrade,
    )

_LAZY = {
    "DEFAULT_TOLERANCE": "seqkv.codec",
    "CodingTrace": "seqkv.codec",
    "CompressResult": "seqkv.skv",
    "CompressStats": "seqkv.skv",
    "DecompressResult": "seqkv.codec",
    "DecompressStats": "seqkv.codec",
    "compress": "seqkv.skv",
    "decompress": "seqkv.skv",
    "decompress_batch": "seqkv.skv",
    "decompress_tokens": "seqkv.skv",
    "upgrade": "seqkv.skv",
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
    "upgrade",
]

"""seqkv: a KV cache stored as its token stream coded under the model, plus a coded residual.

Implements and measures arXiv 2604.15356 ("Sequential KV Cache Compression via Probabilistic
Language Tries"). Start with ``seqkv.compress`` / ``seqkv.decompress``; ``level=`` picks the
rate-compute dial (``seqkv.levels``, ``seqkv.parse_level``), ``seqkv.decompress_batch`` decodes
many files together.
"""

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
from seqkv.errors import SeqKVError
from seqkv.levels import CodingLevel, LevelSpec, parse_level
from seqkv.version import __version__

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

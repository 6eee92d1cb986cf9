"""seqkv: a KV cache stored as its token stream coded under the model, plus a coded residual.

Implements and measures arXiv 2604.15356 ("Sequential KV Cache Compression via Probabilistic
Language Tries"). Start with ``seqkv.compress`` / ``seqkv.decompress``.
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
)
from seqkv.errors import SeqKVError
from seqkv.version import __version__

__all__ = [
    "DEFAULT_TOLERANCE",
    "CodingTrace",
    "CompressResult",
    "CompressStats",
    "DecompressResult",
    "DecompressStats",
    "SeqKVError",
    "__version__",
    "compress",
    "decompress",
]

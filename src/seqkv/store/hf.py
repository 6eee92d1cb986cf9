"""Persist and restore a Hugging Face ``DynamicCache`` in two lines, bit for bit.

    save_cache(cache, "chat.skvc", model=model, tokens=ids)   # ids: the tokens the cache holds
    cache = load_cache("chat.skvc", model=model)              # then generate(..., cache=cache)

The file is a ``.skv`` (``seqkv.compress``: the tokens coded under the model, the KV as a
bit-exact residual against the model's recomputation) behind an 10-byte frame that records the
cache's dtype. float32, float16 and bfloat16 caches are stored as float32 (exactly: every value
of the narrower types is a float32) and cast back on load, so the restored cache holds the same
bits and generation continues identically.

Invariants:
1. ``load_cache(save_cache(c))`` holds the bits of ``c`` (enforced: tolerance 0, the codec checks
   its KV checksum, and the cast back is exact; tested for the three dtypes).
2. The model must be the one that made the cache, at the cache's dtype; another model is refused
   by the codec (``ModelMismatchError``).

NOTE: the default level is ``ngram``: its tokens decode without model probabilities, and both
sides rebuild the KV with one prefill, which repeats bit for bit at any dtype (and is a prefill
cache's own bits); the
model-coded levels need the row-invariant forward, whose invariance is established for float32
(a float16 ``rows`` round trip failed its token checksum here). At tolerance 0 the residual,
not the token code, dominates the size anyway.

NOTE: the residual is bit-exact in float32's ordering, so where the codec's recomputation differs
from the cache by k ulps of a narrow dtype it stores k * 2**13 (float16) or k * 2**16 (bfloat16)
float32 ulps, an escape of 4 bytes each; the tests report the sizes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from seqkv.bounds import raise_unless_all_hold
from seqkv.codec import DecodeItem, decode_many, encode
from seqkv.errors import InvalidKVError
from seqkv.files import write_atomically
from seqkv.formats.hf_cache import DTYPE_NAMES, read_cache, write_cache
from seqkv.kvcache import cache_from_tensor, tensor_from_cache
from seqkv.models.adapter import CausalLM
from seqkv.models.profiles import reader_side

# The dtypes a cache file records, in ``seqkv.formats.hf_cache.DTYPE_NAMES``'s order.
_DTYPES = tuple(getattr(torch, name) for name in DTYPE_NAMES)


@dataclass(frozen=True, slots=True)
class SavedCache:
    path: Path
    tokens: int
    file_bytes: int
    raw_bytes: int  # the cache's own tensors at its dtype


def _adapter(model: PreTrainedModel | CausalLM) -> CausalLM:
    if isinstance(model, CausalLM):
        return model
    name = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    return CausalLM(model, None, name)


def save_cache(cache: DynamicCache, path: str | os.PathLike[str], *,
               model: PreTrainedModel | CausalLM, tokens: Sequence[int] | torch.Tensor,
               level: str = "ngram") -> SavedCache:
    """Write ``cache`` (the KV of ``tokens`` under ``model``) to ``path``, replacing it whole.

    ``level``: a ``seqkv.levels`` level; keep ``ngram`` for float16 and bfloat16 caches.
    """
    kv = tensor_from_cache(cache)
    if kv.dtype not in _DTYPES:
        raise InvalidKVError(
            f"save_cache stores float32, float16 or bfloat16 caches, not {kv.dtype}")
    ids = [int(t) for t in (tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor)
                            else tokens)]
    if kv.shape[3] != len(ids):
        raise InvalidKVError(
            f"the cache holds {kv.shape[3]} positions but {len(ids)} tokens were given: pass the "
            "tokens whose KV the cache holds (after generate: sequences[0, :-1])")
    encoded = encode(_adapter(model), ids, kv.detach().to("cpu", torch.float32), tolerance=0.0,
                     level=level)
    raise_unless_all_hold(encoded.bounds)
    data = write_cache(_DTYPES.index(kv.dtype), encoded.session)
    write_atomically(path, data)
    return SavedCache(Path(path), len(ids), len(data), kv.numel() * kv.element_size())


def load_cache(path: str | os.PathLike[str], *,
               model: PreTrainedModel | CausalLM) -> DynamicCache:
    """The cache ``save_cache`` wrote (either version of its file), on the model's device, at
    its original dtype. A file of another kind is ``NotASeqKVFileError``, of an unknown version
    ``UnsupportedVersionError``, a damaged one ``CorruptFileError``."""
    adapter = _adapter(model)
    read = read_cache(Path(path).read_bytes(), reader_side(adapter))
    decoded = decode_many(adapter, [DecodeItem(read.session)])[0]
    return cache_from_tensor(decoded.kv.to(adapter.device, _DTYPES[read.dtype]))

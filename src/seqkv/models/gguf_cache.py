"""A converted copy of each GGUF model, so that a process loads it without converting it again.

transformers reads a GGUF file's metadata one field at a time and rebuilds its tensor-name map
once per tensor, so a conversion costs many times the dequantization itself, and every
``seqkv`` process would pay it. The first load of a GGUF file writes what transformers made of
it (the float32 weights as safetensors, the config, the tokenizer) into a folder of the model
cache, and later loads read that folder and check it.

The cache lives in ``$SEQKV_MODEL_CACHE`` (default ``$XDG_CACHE_HOME/seqkv/models`` or
``~/.cache/seqkv/models``; ``SEQKV_MODEL_CACHE=off`` turns it off), one folder per GGUF file
named by the SHA-256 of the file's bytes, its name (the config records it) and the versions of
seqkv and of the libraries that convert it (a new transformers, gguf or numpy may dequantize
otherwise; ``kernels``, when installed, makes transformers keep GGUF blocks: each gets its own
folder). About 540 MB for the embedded model. Folders of other versions are not removed; a
``.partial-*`` folder an interrupted write left is removed by the next write after an hour.

Invariants:
1. A model loaded from the cache has the identity of the model the GGUF file loads to (its
   config, every weight's bytes, its tokenizer's vocabulary: ``CausalLM.identity``) and
   tokenizes a probe text to the same ids: both are checked on every cached load against what
   the folder recorded when it was written from the GGUF. A folder that fails the check, or
   cannot be read, is removed and the GGUF is loaded: a damaged or edited cache costs time,
   never a different model (enforced, ``tests/test_gguf_cache.py``).
2. A folder appears whole or not at all: it is written beside its place and renamed into it;
   of two processes writing the same folder, the first rename wins.
3. The cache only saves time: whatever fails in it (a folder that cannot be read or written, a
   full disk, no home folder) or when it is off, the model loads from the GGUF as before. Only
   a ``SEQKV_MODEL_CACHE`` that is neither off nor an absolute path is an error
   (``seqkv.environment``). A key
   whose folder fails its check right after it was written (a model whose conversion does not
   round-trip) is marked and not cached again.
4. Folders are written with the process's umask (a shared cache stays readable by its users).
5. What the check of invariant 1 covers: the folder against its own manifest, which the folder
   holds too. Damage that leaves the two disagreeing (a changed weight, config or tokenizer, a
   truncated file, a missing manifest) is caught for every model; an edit that changes a weight
   and recomputes the manifest's digest is not, except for the embedded model: its loader passes
   the weight digest the package ships outside the cache (``shipped_weights_sha256``: the first
   line of ``seqkv/data/baselines/figures/integer.json``) as ``expected_weights``, and a folder
   whose weights have another digest is discarded and rebuilt from the GGUF, never loaded
   (enforced; ``tests/test_gguf_cache.py``). For any other GGUF file nothing outside the cache
   vouches for its weights: a cache writable by someone else is trusted as far as its manifest
   goes. A conversion that itself gives other weights than the shipped digest (another
   transformers or gguf release) is then never cached (invariant 3's mark).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.resources
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils.quantization_config import GgufConfig

from seqkv import environment
from seqkv.errors import EnvironmentVariableError
from seqkv.models.adapter import CausalLM

_LOG = logging.getLogger(__name__)
_LAYOUT = 1  # what a folder holds; a change here names new folders
_MANIFEST = "seqkv-model.json"
_UNCACHEABLE = ".uncacheable"  # beside a folder name: that key is never cached
# Tokenized on every cached load and compared with the ids the GGUF's tokenizer gave: the
# identity hashes the vocabulary, not the pre-tokenizer or normalizer that choose among it.
PROBE_TEXT = (
    "Hello, wörld! 你好 — naïve café\n\tdef f(x):  return x ** 2  # ok\r\n"
    "<|im_start|>user 12,345.67 e^{iπ}+1=0 \u00a0 tabs\t\tand  spaces</s>"
)
_LIBRARIES = ("seqkv", "transformers", "gguf", "numpy", "kernels", "torch", "tokenizers",
              "safetensors")
_STALE_SECONDS = 3600  # a .partial-* folder this old belongs to no running write


def cache_root() -> Path | None:
    """The model cache's folder, or None when ``SEQKV_MODEL_CACHE=off``; a value that is
    neither off nor an absolute path is ``EnvironmentVariableError``."""
    if environment.switched_off("SEQKV_MODEL_CACHE"):
        return None
    explicit = environment.path("SEQKV_MODEL_CACHE", off=True)
    if explicit is not None:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "seqkv" / "models"


def cache_key(file: Path) -> str:
    """The folder name of ``file``'s converted copy: its bytes, its name and the converting
    libraries' versions."""
    digest = hashlib.sha256()
    with file.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 22), b""):
            digest.update(block)
    versions = {name: _version(name) for name in _LIBRARIES}
    digest.update(json.dumps([_LAYOUT, file.name, versions], sort_keys=True).encode())
    return digest.hexdigest()[:32]


def shipped_weights_sha256() -> str | None:
    """The embedded model's weight digest as the package ships it (invariant 5), or None when
    the baseline cannot be read."""
    path = Path(str(importlib.resources.files("seqkv") / "data" / "baselines" / "figures"
                    / "integer.json"))
    try:
        with path.open("rb") as stream:
            head = json.loads(stream.readline(1 << 16))
    except (OSError, ValueError):
        return None
    digest = head.get("model_weights_sha256") if isinstance(head, dict) else None
    return digest if isinstance(digest, str) and len(digest) == 64 else None


def load_through_cache(file: Path, name: str, load_gguf: Callable[[], CausalLM],
                       expected_weights: str | None = None) -> CausalLM:
    """The model of the GGUF ``file``: from its converted copy when one passes its check (and,
    given ``expected_weights``, has weights of that digest: invariant 5), else from
    ``load_gguf()``, whose result is then written to the cache for the next process.
    Only ``load_gguf`` raises: a cache that fails in any way is passed by."""
    try:
        root = cache_root()
        folder = None if root is None else root / cache_key(file)
        if folder is not None and folder.with_suffix(_UNCACHEABLE).exists():
            folder = None
        if folder is not None and folder.is_dir():
            cached = _read(folder, name, expected_weights)
            if cached is not None:
                return cached
            shutil.rmtree(folder, ignore_errors=True)
    except EnvironmentVariableError:
        raise  # a bad SEQKV_MODEL_CACHE is the caller's error, not the cache's (invariant 3)
    # NOTE: broad on purpose (invariant 3): no home folder (RuntimeError), a cache folder that
    # cannot be entered (PermissionError), an unreadable file (left to load_gguf to name).
    except Exception as error:
        _LOG.warning("the model cache is passed by (%s): loading the GGUF file", error)
        folder = None
    model = load_gguf()
    if folder is not None and _write(folder, model) and _read(
            folder, name, expected_weights) is None:
        shutil.rmtree(folder, ignore_errors=True)  # it does not round-trip: never again
        with contextlib.suppress(OSError):
            folder.with_suffix(_UNCACHEABLE).touch()
    return model


def _read(folder: Path, name: str, expected_weights: str | None = None) -> CausalLM | None:
    """The model in ``folder`` if it is whole, is the model it recorded and (given
    ``expected_weights``) has weights of that digest; None otherwise."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text("utf-8"))
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                     dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        quantization = manifest["quantization_config"]
        if quantization is not None:
            # the GGUF load leaves this in the config, and the identity hashes the config
            model.config.quantization_config = GgufConfig(**{
                key: value for key, value in quantization.items() if key != "quant_method"})
        loaded = CausalLM(model, tokenizer, name)
        identity = loaded.identity
        found = {"config": identity.config_sha256, "weights": identity.weights_sha256,
                 "tokenizer": identity.tokenizer_sha256}
        probe = tokenizer(PROBE_TEXT, add_special_tokens=False).input_ids
        same = (found == manifest["identity"] and probe == manifest["probe_ids"]
                and loaded.decode_tokens(probe) == manifest["probe_decoded"])
    # NOTE: broad on purpose: whatever a damaged folder makes transformers, safetensors or json
    # raise, the answer is the same (load the GGUF), and invariant 1 is checked below.
    except Exception as error:
        _LOG.warning("the model cache folder %s cannot be read (%s): loading the GGUF file",
                     folder, error)
        return None
    if not same:
        _LOG.warning("the model cache folder %s holds another model than its GGUF file: "
                     "loading the GGUF file", folder)
        return None
    if expected_weights is not None and identity.weights_sha256 != expected_weights:
        _LOG.warning("the model cache folder %s holds weights of digest %s, not the embedded "
                     "model's %s: loading the GGUF file", folder, identity.weights_sha256[:16],
                     expected_weights[:16])
        return None
    return loaded


def _write(folder: Path, model: CausalLM) -> bool:
    """Write ``model`` (just loaded from its GGUF) as ``folder``; whether this call wrote it
    (on any failure, nothing is left)."""
    if model.tokenizer is None:
        return False
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(folder.parent)
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=folder.parent))
    except OSError as error:
        _LOG.info("the model cache %s cannot be written (%s)", folder.parent, error)
        return False
    try:
        save_model(model.model, str(partial / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        quantization = config.pop("quantization_config", None)
        (partial / "config.json").write_text(json.dumps(config, default=str), "utf-8")
        model.tokenizer.save_pretrained(partial)
        identity = model.identity
        probe = model.tokenizer(PROBE_TEXT, add_special_tokens=False).input_ids
        manifest: dict[str, Any] = {
            "layout": _LAYOUT,
            "identity": {"config": identity.config_sha256, "weights": identity.weights_sha256,
                         "tokenizer": identity.tokenizer_sha256},
            "probe_ids": probe,
            "probe_decoded": model.decode_tokens(probe),
            "quantization_config": (None if quantization is None
                                    else json.loads(json.dumps(quantization, default=_plain))),
            "versions": {name: _version(name) for name in _LIBRARIES},
        }
        (partial / _MANIFEST).write_text(json.dumps(manifest, indent=1), "utf-8")
        _umask_modes(partial)
        os.rename(partial, folder)
        return True
    # NOTE: broad on purpose (invariant 3): a full disk, another process's rename first, or
    # whatever saving an unusual model raises leaves the load as it was
    except Exception as error:
        _LOG.info("the model cache folder %s was not written (%s)", folder, error)
        return False
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def _umask_modes(folder: Path) -> None:
    """``folder`` and its files with the modes the umask gives new ones (mkdtemp made it 0700)."""
    mask = os.umask(0)
    os.umask(mask)
    folder.chmod(0o777 & ~mask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~mask)


def _remove_stale(root: Path) -> None:
    """``.partial-*`` folders older than ``_STALE_SECONDS``: writes that were killed."""
    now = time.time()
    for partial in root.glob(".partial-*"):
        with contextlib.suppress(OSError):
            if now - partial.stat().st_mtime > _STALE_SECONDS:
                shutil.rmtree(partial, ignore_errors=True)


def _plain(value: object) -> object:
    """JSON for the enum values in a quantization config: their value (``"gguf"``)."""
    return getattr(value, "value", str(value))


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"

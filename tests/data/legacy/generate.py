"""Generates the format-2 (and -1) .skv files beside this script with the format-2 writer.

Run once with seqkv at commit 24f1907 (the last release writing format 2), from its checkout:
``PYTHONPATH=src python tests/data/legacy/generate.py tests/data/legacy``. Kept for provenance;
the current seqkv only reads these files.
"""
import hashlib
import json
import struct
import sys
from pathlib import Path

import torch

from seqkv import compress
from seqkv.models import tiny_random_llama

out = Path(sys.argv[1])
model = tiny_random_llama()
tokens = [5, 17, 17, 3, 99, 250, 7, 7, 7, 31, 400, 12]
kv = model.prefill(tokens)
noisy = torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in kv.layers])
noisy = noisy + 3e-5 * torch.randn(noisy.shape, generator=torch.Generator().manual_seed(0))
cases = {"tokens": dict(kv=kv), "tokens-bitexact": dict(kv=noisy, tolerance=0.0),
         "rows": dict(kv=kv, level="rows"), "segments-3": dict(kv=kv, level="segments:3"),
         "ngram": dict(kv=kv, level="ngram"), "plain": dict(level="plain")}
for name, kwargs in cases.items():
    data = compress(model, tokens, **kwargs).data
    (out / f"v2-{name}.skv").write_bytes(data)
# a format-1 file: the same container with version 1 and no level fields
data = (out / "v2-tokens.skv").read_bytes()
prefix = struct.Struct("<8sHHIQQQ")
magic, version, reserved, hlen, tlen, wlen, elen = prefix.unpack_from(data)
header = json.loads(data[prefix.size:prefix.size + hlen])
header["format_version"] = 1
for key in ("level", "segments", "vocab_size"):
    del header["tokens"][key]
raw = json.dumps(header, sort_keys=True).encode()
body = (prefix.pack(magic, 1, reserved, len(raw), tlen, wlen, elen) + raw
        + data[prefix.size + hlen:-32])
(out / "v1-tokens.skv").write_bytes(body + hashlib.sha256(body).digest())
(out / "tokens.json").write_text(json.dumps(tokens))
print("ok")

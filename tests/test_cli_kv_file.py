"""The ``--kv-out`` file: the same bytes for the same KV, whatever order safetensors chose."""

from __future__ import annotations

import json
import struct

import torch
from safetensors.torch import load, save

from seqkv.cli.sessions import kv_file_bytes, sorted_metadata


def _with_metadata_order(data: bytes, order: list[str]) -> bytes:
    """``data`` with its metadata keys in ``order``, as another process may have written it."""
    (length,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + length])
    header["__metadata__"] = {key: header["__metadata__"][key] for key in order}
    text = json.dumps(header, separators=(",", ":")).encode().ljust(length, b" ")
    return data[:8] + text + data[8 + length :]


def test_the_metadata_order_of_a_kv_file_is_sorted_whatever_safetensors_wrote() -> None:
    """Mutant: ``sorted_metadata`` returning its input -> the two orders stay two files."""
    kv = torch.randn(2, 2, 3, 5, 4, generator=torch.Generator().manual_seed(0))  # [L, 2, H, T, D]
    written = kv_file_bytes(kv, [1, 2, 3, 4, 5], "model-x")
    orders = [_with_metadata_order(written, ["model", "layout"]),
              _with_metadata_order(written, ["layout", "model"])]
    assert orders[0] != orders[1]
    assert sorted_metadata(orders[0]) == sorted_metadata(orders[1]) == written
    tensors = load(written)
    assert torch.equal(tensors["keys"], kv[:, 0]) and torch.equal(tensors["values"], kv[:, 1])
    assert tensors["tokens"].tolist() == [1, 2, 3, 4, 5]


def test_a_file_without_metadata_is_left_as_written() -> None:
    data = save({"a": torch.zeros(3)})
    assert sorted_metadata(data) == data

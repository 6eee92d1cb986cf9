"""Which lossless layout of KV bits pays: the probe behind the warm tier's exact coding.

For a couple of held-out texts (``benchmarks/texts/heldout``: prose and code, the first
``--tokens`` tokens) it takes SmolLM2's KV in each engine dtype, produced in that dtype (the
network run in bfloat16 or float16, as such an engine computes it) and cast from float32, cuts it
into 32-token blocks (the connector's unit) and codes every block with each candidate layout:

* ``zlib`` of the raw bytes (levels 1 and 6), and of each byte plane apart;
* the **top byte plane** (sign and high exponent bits) deflated with zlib's run-length strategy,
  channel-major (``[L, 2, H, D, T]``) or token-major, the other bytes stored: the layout
  ``seqkv.warm.exact`` ships (channel-major), measured through ``ExactCodec`` itself;
* the **exponent field** alone deflated, sign and mantissa stored (a field split);
* the top plane XORed with the previous position's (a prediction along the sequence);
* the top plane coded by constriction's ANS under the block's own categorical model (its
  table counted at 2 bytes an entry);

next to entropy bounds: per block, of the top byte and of the exponent field (each with the
other bits stored); per text, of each value's exponent and sign under a model of its channel
(layer, key or value, head, dimension) fitted to the whole text, the mantissa stored: a model no
block could carry, so a limit on what modelling exponents and signs can give. Bytes are the
planes' only (no digest or framing, which every layout would pay alike); the ratio is raw bytes
over coded bytes. Decode MB/s are of raw KV bytes rebuilt per second, on this (shared) machine:
a guide, not a figure to compare across runs. A layout's row times its inflate (or ANS decode)
alone, block by block; ``ExactCodec``'s, the median of 3 decodes of all the text's blocks,
digest check and reassembly of the values included.

Writes ``--markdown`` (default ``reports/exact_layouts.md``)::

    PYTHONPATH=src .venv/bin/python benchmarks/exact_layouts.py
"""

from __future__ import annotations

import argparse
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import constriction
import numpy as np
import torch
from transformers import DynamicCache

from seqkv.kvcache import tensor_from_cache, with_cache
from seqkv.models import CausalLM, load_default_model
from seqkv.provenance import RunHeader, start_run
from seqkv.types import KVGeometry
from seqkv.warm import ExactCodec, ExactConfig

BLOCK = 32
TEXTS = ("prose", "code")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FIELDS = {"float32": (8, 23), "bfloat16": (8, 7), "float16": (5, 10)}
"""Exponent and mantissa bits of each dtype."""


@dataclass(frozen=True)
class Row:
    text: str
    dtype: str
    source: str
    """``produced``: the network run in the dtype; ``cast``: float32 KV cast to it."""
    layout: str
    raw_bytes: int
    coded_bytes: float
    decode_mb_s: float | None

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.coded_bytes


def kv_in(model: CausalLM, tokens: list[int], dtype: torch.dtype) -> torch.Tensor:
    """``[L, 2, H, T, D]`` KV of ``tokens`` computed by the network in ``dtype``."""
    if dtype == torch.float32:
        return model.kv_tensor(model.prefill(tokens))
    network = model.twin(dtype)
    cache = DynamicCache()
    with torch.inference_mode():
        network(input_ids=torch.tensor([tokens]), **with_cache(network, cache), use_cache=True,
                logits_to_keep=1)
    return tensor_from_cache(cache).detach().cpu()


def _unsigned(block: torch.Tensor) -> np.ndarray:
    ints = block.contiguous().view(torch.int32 if block.element_size() == 4 else torch.int16)
    return ints.numpy().view(np.uint32 if block.element_size() == 4 else np.uint16)


def _deflate(data: np.ndarray, level: int = 1, strategy: int = zlib.Z_RLE) -> bytes:
    coder = zlib.compressobj(level, zlib.DEFLATED, 15, 6, strategy)
    return coder.compress(np.ascontiguousarray(data).data) + coder.flush()


def _entropy(values: np.ndarray) -> float:
    """Bits: the block's empirical entropy times its count."""
    _, counts = np.unique(values, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum()) * values.size


def _ans(values: np.ndarray) -> tuple[int, float]:
    """Bytes of the top plane under a per-block categorical model, and decode seconds."""
    symbols = values.reshape(-1).astype(np.int32)
    low, high = int(symbols.min()), int(symbols.max())
    counts = np.bincount(symbols - low, minlength=high - low + 1).astype(np.float64)
    model = constriction.stream.model.Categorical(counts / counts.sum(), perfect=False)
    coder = constriction.stream.stack.AnsCoder()
    coder.encode_reverse(symbols - low, model)
    compressed = coder.get_compressed()
    started = time.perf_counter()
    decoder = constriction.stream.stack.AnsCoder(compressed)
    decoded = decoder.decode(model, symbols.size)
    seconds = time.perf_counter() - started
    assert np.array_equal(decoded + low, symbols)
    return compressed.nbytes + 2 * (high - low + 1), seconds


def _inflate_seconds(coded: bytes) -> float:
    started = time.perf_counter()
    zlib.decompress(coded)
    return time.perf_counter() - started


def layouts(bits: np.ndarray, dtype: str) -> dict[str, tuple[float, float | None]]:
    """Coded bytes and decode seconds (where measured) of one block ``[L, 2, H, T, D]``."""
    width = bits.dtype.itemsize
    exponent_bits, mantissa_bits = FIELDS[dtype]
    raw = bits.tobytes()
    planes = bits.astype(f"<u{width}").view(np.uint8).reshape(*bits.shape, width)
    top = planes[..., width - 1]
    channels = top.transpose(0, 1, 2, 4, 3)  # [L, 2, H, D, T]
    rest = bits.size * (width - 1)
    out: dict[str, tuple[float, float | None]] = {}
    for level in (1, 6):
        coded = zlib.compress(raw, level)
        out[f"zlib {level} of the raw bytes"] = (len(coded), _inflate_seconds(coded))
    out["zlib 1 of each byte plane"] = (sum(len(zlib.compress(planes[..., i].tobytes(), 1))
                                            for i in range(width)), None)
    coded = _deflate(top)
    out["top plane deflated (RLE), token-major, rest stored"] = (len(coded) + rest, None)
    coded = _deflate(channels)
    out["top plane deflated (RLE), channel-major, rest stored"] = (
        len(coded) + rest, _inflate_seconds(coded))
    coded = _deflate(channels, strategy=zlib.Z_HUFFMAN_ONLY)
    out["top plane Huffman only, channel-major, rest stored"] = (len(coded) + rest, None)
    exponent = ((bits >> mantissa_bits) & ((1 << exponent_bits) - 1)).astype(np.uint8)
    field_rest = bits.size * (1 + mantissa_bits) / 8
    out["exponent field deflated (RLE), channel-major, sign+mantissa stored"] = (
        len(_deflate(exponent.transpose(0, 1, 2, 4, 3))) + field_rest, None)
    previous = np.concatenate([np.zeros_like(top[..., :1, :]), top[..., :-1, :]], axis=3)
    out["top plane XOR the previous position's, deflated (RLE), channel-major"] = (
        len(_deflate((top ^ previous).transpose(0, 1, 2, 4, 3))) + rest, None)
    size, seconds = _ans(channels)
    out["top plane, constriction ANS under the block's categorical model"] = (size + rest,
                                                                              seconds)
    out["bound: entropy of the top byte, rest stored"] = (_entropy(top) / 8 + rest, None)
    out["bound: entropy of the exponent field, sign+mantissa stored"] = (
        _entropy(exponent) / 8 + field_rest, None)
    return out


def _conditional(values: np.ndarray, context: np.ndarray) -> float:
    """Bits: the empirical entropy of ``values`` given ``context`` times the count."""
    joint = context.astype(np.int64) * 65536 + values.astype(np.int64)
    return _entropy(joint) - _entropy(context)


def channel_bound(kv: np.ndarray, dtype: str) -> float:
    """Bytes of a text's KV ``[L, 2, H, T, D]`` (unsigned bits) with each value's exponent and
    sign coded at their entropy given the channel (fitted to the text), the mantissa stored."""
    exponent_bits, mantissa_bits = FIELDS[dtype]
    layers, _, heads, _, dim = kv.shape
    channel = np.broadcast_to(np.arange(layers * 2 * heads * dim).reshape(
        layers, 2, heads, 1, dim), kv.shape)
    exponent = (kv >> mantissa_bits) & ((1 << exponent_bits) - 1)
    sign = kv >> (exponent_bits + mantissa_bits)
    bits = (_conditional(exponent, channel)
            + _conditional(sign, channel * (1 << exponent_bits) + exponent))
    return bits / 8 + kv.size * mantissa_bits / 8


def shipped(blocks: list[torch.Tensor], dtype: str) -> tuple[int, float]:
    """Plane bytes (payload less digest and length) and decode seconds of ``ExactCodec``."""
    layers, _, heads, _, dim = blocks[0].shape
    codec = ExactCodec(ExactConfig.of(DTYPES[dtype]), KVGeometry(layers, heads, dim), BLOCK)
    payloads, _ = codec.encode(torch.stack(blocks))
    times = []
    for _ in range(3):
        started = time.perf_counter()
        codec.decode(payloads)
        times.append(time.perf_counter() - started)
    return sum(len(p) - codec.side_bytes(p) for p in payloads), sorted(times)[1]


def measure(model: CausalLM, tokens_per_text: int, log: Callable[[str], None]) -> list[Row]:
    rows = []
    for text in TEXTS:
        path = Path(__file__).parent / "texts" / "heldout" / f"{text}.txt"
        tokens = model.encode_text(path.read_text())[:tokens_per_text]
        full = model.kv_tensor(model.prefill(tokens))
        for name, dtype in DTYPES.items():
            sources = {"produced": kv_in(model, tokens, dtype)}
            if dtype != torch.float32:
                sources["cast"] = full.to(dtype)
            for source, kv in sources.items():
                count = kv.shape[3] // BLOCK
                blocks = [kv[:, :, :, i * BLOCK : (i + 1) * BLOCK].contiguous()
                          for i in range(count)]
                raw = sum(b.numel() * b.element_size() for b in blocks)
                sizes: dict[str, list[float]] = {}
                seconds: dict[str, float | None] = {}
                for block in blocks:
                    for layout, (size, spent) in layouts(_unsigned(block), name).items():
                        sizes.setdefault(layout, []).append(size)
                        seconds[layout] = (None if spent is None
                                           else (seconds.get(layout) or 0.0) + spent)
                whole = _unsigned(torch.cat(blocks, dim=3))
                sizes["bound: exponent and sign given the channel, fitted to the text"] = [
                    channel_bound(whole, name)]
                coded, spent = shipped(blocks, name)
                sizes["seqkv.warm.exact (ExactCodec: channel-major top plane, RLE)"] = [coded]
                seconds["seqkv.warm.exact (ExactCodec: channel-major top plane, RLE)"] = spent
                for layout, values in sizes.items():
                    took = seconds.get(layout)
                    rows.append(Row(text, name, source, layout, raw, sum(values),
                                    None if took is None else raw / took / 1e6))
                log(f"{text} {name} {source}: {count} blocks")
    return rows


def render(rows: list[Row], tokens: dict[str, int], header: RunHeader) -> str:
    lines = ["# Lossless layouts of KV bits (the warm tier's exact coding)", "",
             header.markdown(), "",
             "**Model:** SmolLM2-135M-Instruct (embedded; 30 layers, "
             "3 KV heads, head dim 64), transformers. **KV:** the held-out "
             + ", ".join(f"{t} text ({n} tokens)" for t, n in tokens.items())
             + f", in {BLOCK}-token blocks; each dtype produced by the network run in it, and "
             "(bfloat16, float16) cast from the float32 KV. **Bytes:** the coded planes only "
             "(no digest, length or framing). The machine is shared: decode MB/s, of raw KV "
             "bytes rebuilt per second, are a guide.", ""]
    for dtype in DTYPES:
        lines += [f"## {dtype}", "", "| layout | " + " | ".join(
            f"{t} {s}" for t in TEXTS for s in ("produced", "cast")
            if dtype != "float32" or s == "produced") + " | decode MB/s |",
            "|---|" + "---:|" * (len(TEXTS) * (1 if dtype == "float32" else 2) + 1)]
        chosen = [r for r in rows if r.dtype == dtype]
        for layout in dict.fromkeys(r.layout for r in chosen):
            cells = [f"{r.ratio:.3f}x" for r in chosen if r.layout == layout]
            speeds = [r.decode_mb_s for r in chosen if r.layout == layout
                      and r.decode_mb_s is not None]
            speed = f"{min(speeds):,.0f}-{max(speeds):,.0f}" if speeds else "-"
            lines.append(f"| {layout} | " + " | ".join(cells) + f" | {speed} |")
        lines.append("")
    lines += ["Ratios are raw bytes over coded bytes (higher is better).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--markdown", type=Path, default=Path("reports/exact_layouts.md"))
    args = parser.parse_args()
    torch.manual_seed(0)
    model = load_default_model()
    command = f"python benchmarks/exact_layouts.py --tokens {args.tokens}"
    header = start_run(model.name, f"the held-out texts ({', '.join(TEXTS)}), first "
                                   f"{args.tokens} tokens each", command)
    rows = measure(model, args.tokens, print)
    tokens = {t: len(model.encode_text((Path(__file__).parent / "texts" / "heldout"
                                        / f"{t}.txt").read_text())[: args.tokens])
              for t in TEXTS}
    args.markdown.write_text(render(rows, tokens, header.finished()))
    print(args.markdown)


if __name__ == "__main__":
    main()

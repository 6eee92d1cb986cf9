"""Portable files across devices: coded on one, decoded on another; batched decoding on a GPU.

The ``portable`` level's promise is that its tokens decode on any machine with the same weights,
tokenizer and predictor. ``scripts/gpu_check.sh`` runs this where a GPU is lent (``python
benchmarks/portable_devices.py --device cuda``; sized for about five minutes on an H100/H200, an
estimate: no GPU has run it yet). Against the CPU's integer forward (``native.c`` where it
builds) it checks and measures:

1. **logits**: the same tokens forwarded by the CPU engine and by the device's (a prefill,
   token-by-token steps, two sequences in one batch) give the same int64 logits, bit for bit;
2. **files**: each shipped text's first ``--tokens`` tokens coded at ``portable`` on the CPU
   decode on the device to the same tokens, and files coded on the device decode on the CPU.
   The KV comes back recomputed under the decoder's own execution profile (``kv_exact`` False
   across devices, as documented; not a failure);
3. **throughput**: ``S`` sessions (``--sessions``, default 64, 256 and 1,024) of ``--decode-tokens``
   tokens decoded together on the device (``decompress_batch``: integer forwards batched across
   sessions, then one float prefill per session for its KV) against plain batched greedy
   generation of as many tokens for as many sessions on the same device (transformers
   ``generate``). The sessions are 64 distinct files, repeated: coding 1,024 files (each with
   its bounds' float reference) would cost more than the decode measured.

With ``--device cpu`` (the dry run ``tests/test_portable_devices.py`` makes) the "device" engine
is the integer forward's torch statement on the CPU, so check 1 compares ``native.c`` with the
torch statement; checks 2 and 3 then run CPU against CPU (the script's own logic, not
portability).

Exit status: 1 when any check fails (a logit, a token), else 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from research.bench.decode import kind_tokens
from seqkv.bench.texts import TEXT_FILES
from seqkv.levels.portable import IntegerPredictors
from seqkv.models.adapter import CausalLM
from seqkv.models.integer.forward import IntegerForward
from seqkv.models.integer.weights import integer_weights
from seqkv.models.loading import load_default_model
from seqkv.schedule import pinned_threads
from seqkv.skv import compress, decompress, decompress_batch


@dataclass(frozen=True)
class FileCheck:
    kind: str
    coded_on: str
    decoded_on: str
    tokens: int
    tokens_equal: bool
    kv_exact: bool  # False across devices is expected (another execution profile)


@dataclass(frozen=True)
class Throughput:
    sessions: int
    tokens_per_session: int
    decode_tokens_per_second: float  # decompress_batch, KV prefills included
    generate_tokens_per_second: float  # transformers generate, greedy, same device
    exact: bool


def model_on(device: str) -> CausalLM:
    """The embedded model with its float weights on ``device``, and its integer predictor
    there too (the portable level runs it on the CPU unless told otherwise)."""
    model = load_default_model()
    model.model.to(device)
    model.derived(IntegerPredictors, lambda m: IntegerPredictors(m, device))
    return model


def engines(cpu: CausalLM, device: str) -> tuple[IntegerForward, IntegerForward]:
    """The CPU's integer forward and the device's (on the CPU: the torch statement)."""
    weights = integer_weights(cpu)
    reference = IntegerForward(weights)
    if device == "cpu":
        return reference, IntegerForward(weights, backend="torch")
    return reference, IntegerForward(weights.to(device))


def logit_mismatches(reference: IntegerForward, other: IntegerForward,
                     tokens: Sequence[int]) -> tuple[int, int]:
    """Rows whose int64 logits differ between the two engines, and rows compared: one
    prefill of ``tokens``, then token-by-token steps over its last quarter, then ``tokens``
    beside its first half in one batch."""
    mismatches = 0
    with pinned_threads(2):
        expected = reference.forward([(reference.new_sequence(), list(tokens))])[0]
        got = other.forward([(other.new_sequence(), list(tokens))])[0]
        mismatches += int((expected != got).any(axis=1).sum())
        split = len(tokens) - max(1, len(tokens) // 4)
        sequence = other.new_sequence()
        other.forward([(sequence, list(tokens[:split]))])
        for at in range(split, len(tokens)):
            row = other.forward([(sequence, [tokens[at]])])[0][0]
            mismatches += int((row != expected[at]).any())
        short = list(tokens[: len(tokens) // 2])
        batch = other.forward([(other.new_sequence(), list(tokens)),
                               (other.new_sequence(), short)])
        mismatches += int((batch[0] != expected).any(axis=1).sum())
        mismatches += int((batch[1] != expected[: len(short)]).any(axis=1).sum())
    return mismatches, 2 * len(tokens) + (len(tokens) - split) + len(short)


def file_checks(cpu: CausalLM, other: CausalLM, device: str, count: int) -> list[FileCheck]:
    """Each shipped text coded at ``portable`` on one side and decoded on the other."""
    checks = []
    for kind in TEXT_FILES:
        tokens = kind_tokens(cpu, kind, count)
        for coder, decoder, coded_on, decoded_on in ((cpu, other, "cpu", device),
                                                     (other, cpu, device, "cpu")):
            # with the coder's own KV, so that the file records it and kv_exact says something
            data = compress(coder, tokens, coder.prefill(tokens), level="portable").data
            decoded = decompress(decoder, data)
            checks.append(FileCheck(kind, coded_on, decoded_on, len(tokens),
                                    decoded.tokens == tokens, decoded.kv_exact))
    return checks


def throughput(cpu: CausalLM, other: CausalLM, sessions: Sequence[int], count: int,
               distinct: int = 64) -> list[Throughput]:
    """Batched decode on ``other``'s device against batched greedy generation there."""
    pool: list[int] = []
    for kind in TEXT_FILES:
        pool += kind_tokens(cpu, kind, 10_000)
    stride = max(1, (len(pool) - count) // distinct)
    chunks = [pool[i * stride : i * stride + count] for i in range(distinct)]
    files = [compress(cpu, chunk, level="portable").data for chunk in chunks]
    start = other.start_token_id if other.start_token_id is not None else chunks[0][0]
    decompress_batch(other, files[:2])  # warm-up: the device's start-up is not in the first row
    _generate(other, 2, 2, start)
    results = []
    for size in sessions:
        batch = [files[i % distinct] for i in range(size)]
        started = time.perf_counter()
        decoded = decompress_batch(other, batch)
        seconds = time.perf_counter() - started
        exact = all(d.tokens == chunks[i % distinct] for i, d in enumerate(decoded))
        generate_seconds = _generate(other, size, count, start)
        results.append(Throughput(size, count, size * count / seconds,
                                  size * count / generate_seconds, exact))
    return results


def _generate(model: CausalLM, sessions: int, count: int, start: int) -> float:
    """Seconds of greedy generation of ``count`` tokens for ``sessions`` sessions at once."""
    prompt = torch.full((sessions, 1), start, dtype=torch.long, device=model.device)
    with torch.inference_mode():
        started = time.perf_counter()
        model.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                             max_new_tokens=count, min_new_tokens=count, do_sample=False,
                             pad_token_id=start)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="where the other engine runs")
    parser.add_argument("--tokens", type=int, default=200, help="tokens of each text coded")
    parser.add_argument("--decode-tokens", type=int, default=32,
                        help="tokens per session in the throughput runs")
    parser.add_argument("--sessions", default="64,256,1024",
                        help="comma-separated session counts decoded together")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("portable_devices: no CUDA device visible", file=sys.stderr)
        return 2
    cpu = load_default_model()
    other = cpu if args.device == "cpu" else model_on(args.device)
    reference, engine = engines(cpu, args.device)
    tokens = kind_tokens(cpu, "prose", args.tokens)
    print(f"CPU integer forward: {reference.backend} (the torch statement runs slower: without "
          "AVX-512 VNNI, lower --tokens to stay within the script's time)", file=sys.stderr)
    mismatches, compared = logit_mismatches(reference, engine, tokens)
    files = file_checks(cpu, other, args.device, args.tokens)
    sessions = [int(s) for s in args.sessions.split(",") if s]
    rates = throughput(cpu, other, sessions, args.decode_tokens)
    ok = mismatches == 0 and all(f.tokens_equal for f in files) and all(r.exact for r in rates)
    if args.json:
        print(json.dumps({"device": args.device, "logit_mismatches": mismatches,
                          "logit_rows": compared,
                          "files": [asdict(f) for f in files],
                          "throughput": [asdict(r) for r in rates], "ok": ok}, indent=2))
    else:
        print(f"logits, {engine.backend} on {args.device} vs {reference.backend} on cpu: "
              f"{mismatches} rows differ of {compared}")
        for f in files:
            print(f"{f.kind:10s} coded on {f.coded_on}, decoded on {f.decoded_on}: tokens "
                  f"{'equal' if f.tokens_equal else 'DIFFER'}, kv_exact={f.kv_exact}")
        for r in rates:
            print(f"{r.sessions:5d} sessions x {r.tokens_per_session} tokens: decode "
                  f"{r.decode_tokens_per_second:9.1f} tokens/s, generate "
                  f"{r.generate_tokens_per_second:9.1f} tokens/s "
                  f"({r.decode_tokens_per_second / r.generate_tokens_per_second:.2f}x), "
                  f"exact={r.exact}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

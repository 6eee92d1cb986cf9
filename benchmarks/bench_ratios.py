"""The codec's speed as ratios to plain model work, gated against a committed history.

Run by ``scripts/bench.sh`` (timed, compared with this machine profile's history, failing past
its threshold); ``scripts/test.sh`` runs this file with timing disabled, where every benchmark
runs once on the tiny random Llama so that the code stays exercised in seconds.

Tracked ratios, each a pytest-benchmark benchmark whose statistics are in units of its
reference (``ratio_timing.PairedReference``): every round of the operation is paired with a run
of its reference just before it.

* ``encode[L] / prefill``: ``seqkv.compress(model, tokens, level=L)`` against one
  ``model.prefill(tokens)`` of the same tokens, for L in :data:`ENCODE_LEVELS`;
* ``decode[L] / steps``: ``seqkv.decompress`` of those tokens coded at level L against plain
  token-by-token steps (``model.new_stepper()``, ``.step(token)`` per token, as
  ``seqkv.bench.timing.time_token_by_token``), for L in :data:`DECODE_LEVELS`;
* ``batched decode[16] / 16 single``: ``seqkv.decompress_batch`` of 16 rows-level sessions
  against decoding each of them alone with ``seqkv.decompress``, one after the other;
* ``kernel[op] / reference`` (CUDA only, skipped elsewhere): each Triton kernel of
  ``benchmarks/gpu_kernels.py`` against its torch reference on the same KV-sized input.

Model and data, when timed: the embedded SmolLM2-135M-Instruct, the first :data:`TOKENS`
tokens of the shipped prose sample (``seqkv/data/sample.txt``); the batched sessions are
:data:`SESSION_TOKENS`-token pieces of the first 64 tokens of each shipped text (prose, code,
legal, technical).

Invariants:
1. Every timed operation and every reference runs on one intra-op thread (enforced: the
   ``one_thread`` fixture). NOTE: the project times a prefill on 2 threads elsewhere
   (``research.bench.decode``); here it runs on the coding's one thread, because a 2-thread
   prefill on the loaded 2-core machine took 1.39-3.76 s against 0.52-0.57 s on one thread
   (128 tokens), so its ratio to a one-thread encode would follow the load.
2. Every benchmark checks its result (decoded tokens equal the input tokens; an encode codes
   every token) (enforced).
3. Nothing is timed before the workload's warm-up (enforced by the ``workload`` fixture).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from ratio_timing import PairedReference, time_ratio, timing_enabled

from research.bench.decode import kind_tokens
from seqkv import compress, decompress, decompress_batch
from seqkv.bench.texts import TEXT_FILES
from seqkv.bench.timing import time_token_by_token
from seqkv.models import CausalLM
from seqkv.schedule import pinned_threads

# NOTE: 100 tokens keep one timed run of this file near five minutes on the shared 2-core CPU
# under a load of 3-4 (the tokens level and the token-by-token reference cost one forward per
# token, 80-150 ms each there, and every decode round is paired with a reference run), and every
# level is in its steady state (four segments of 25 tokens).
TOKENS = 100
ENCODE_LEVELS = ("tokens", "rows", "segments:4", "ngram", "plain", "portable")
# NOTE: one level per decoding mechanism: one forward per token (tokens), several streams per
# forward (segments:4), no forward per token and one chunked forward for the KV (ngram). rows
# decodes one session no faster than tokens (reports/decode_levels.md); the batched ratio
# times it where it pays. portable: the integer predictor, one integer forward per token.
DECODE_LEVELS = ("tokens", "segments:4", "ngram", "portable")
SESSIONS = 16
# NOTE: 16 tokens per session because every round of the reference decodes the 16 sessions one
# by one: 1-2 s each at the rows level on the loaded 2-core CPU.
SESSION_TOKENS = 16
THREADS = 1
# Rounds per ratio: 5 where a round (operation and reference) is short, 3 where it is long.
ENCODE_ROUNDS = {"tokens": 3, "rows": 5, "segments:4": 5, "ngram": 5, "plain": 5,
                 "portable": 3}
DECODE_ROUNDS = 3
BATCH_ROUNDS = 3
KERNEL_ROUNDS = 20
# The cases of benchmarks/gpu_kernels.py ``build_cases``, by name.
KERNEL_OPS = (
    "turboquant encode 4b hadamard", "turboquant decode 4b hadamard",
    "turboquant encode 4b orthogonal", "turboquant decode 4b orthogonal",
    "kivi quantize 2b key", "kivi dequantize 2b value",
    "absmax quantize int8", "absmax dequantize int8",
    "absmax quantize fp8_e4m3", "absmax dequantize fp8_e4m3",
    "topk_expectation",
)


@dataclass(frozen=True)
class Workload:
    """The model and tokens every ratio of this module times, and whether they are timed."""

    model: CausalLM
    tokens: list[int]
    sessions: list[list[int]]
    timed: bool

    def describe(self, tokens: int, level: str) -> dict[str, object]:
        return {"model": self.model.name, "tokens": tokens, "level": level, "threads": THREADS}


@pytest.fixture(scope="module")
def workload(request: pytest.FixtureRequest) -> Workload:
    if not timing_enabled(request.config):
        tiny: CausalLM = request.getfixturevalue("tiny_model")
        tokens = [(7 * i + 3) % tiny.vocab_size for i in range(24)]
        return Workload(tiny, tokens, [tokens[i : i + 4] for i in range(SESSIONS)], False)
    model: CausalLM = request.getfixturevalue("real_model")
    tokens = kind_tokens(model, "prose", TOKENS)
    sessions = []
    for kind in TEXT_FILES:
        text = kind_tokens(model, kind, SESSIONS // len(TEXT_FILES) * SESSION_TOKENS)
        sessions += [text[i : i + SESSION_TOKENS] for i in range(0, len(text), SESSION_TOKENS)]
    assert len(sessions) == SESSIONS and all(len(s) == SESSION_TOKENS for s in sessions)
    with pinned_threads(THREADS):
        # Warm-up, untimed: first-use costs (allocations, the row-invariant forward's
        # calibration) would otherwise land in whichever round came first.
        model.prefill(tokens)
        for level in ENCODE_LEVELS:
            decompress(model, compress(model, tokens[:32], level=level).data)
    return Workload(model, tokens, sessions, True)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with pinned_threads(THREADS):
        yield


@pytest.fixture(scope="module")
def coded(workload: Workload) -> dict[str, bytes]:
    """The workload's tokens coded at every decode level (untimed)."""
    with pinned_threads(THREADS):
        return {level: compress(workload.model, workload.tokens, level=level).data
                for level in DECODE_LEVELS}


@pytest.fixture(scope="module")
def sessions_coded(workload: Workload) -> list[bytes]:
    with pinned_threads(THREADS):
        return [compress(workload.model, s, level="rows").data for s in workload.sessions]


@pytest.mark.parametrize("level", ENCODE_LEVELS)
def test_encode(request: pytest.FixtureRequest, workload: Workload, level: str) -> None:
    model, tokens = workload.model, workload.tokens
    reference = (PairedReference("one prefill", lambda: model.prefill(tokens))
                 if workload.timed else None)
    result = time_ratio(request, reference, f"encode[{level}] / prefill", "encode / prefill",
                        lambda: compress(model, tokens, level=level), ENCODE_ROUNDS[level],
                        extra=workload.describe(len(tokens), level))
    assert result.stats.tokens == len(tokens)


@pytest.mark.parametrize("level", DECODE_LEVELS)
def test_decode(request: pytest.FixtureRequest, workload: Workload, coded: dict[str, bytes],
                level: str) -> None:
    model, tokens = workload.model, workload.tokens
    reference = (PairedReference("token-by-token steps",
                                 lambda: time_token_by_token(model, tokens))
                 if workload.timed else None)
    decoded = time_ratio(request, reference, f"decode[{level}] / steps",
                         "decode / token-by-token steps",
                         lambda: decompress(model, coded[level]), DECODE_ROUNDS,
                         extra=workload.describe(len(tokens), level))
    assert decoded.tokens == tokens


def test_batched_decode(request: pytest.FixtureRequest, workload: Workload,
                        sessions_coded: list[bytes]) -> None:
    model = workload.model

    def decode_each() -> None:
        for data in sessions_coded:
            decompress(model, data)

    reference = (PairedReference(f"{SESSIONS} single decodes", decode_each)
                 if workload.timed else None)
    extra = {**workload.describe(sum(len(s) for s in workload.sessions), "rows"),
             "sessions": SESSIONS}
    decoded = time_ratio(request, reference, f"batched decode[{SESSIONS}] / {SESSIONS} single",
                         "batched decode / single decodes",
                         lambda: decompress_batch(model, sessions_coded), BATCH_ROUNDS,
                         extra=extra)
    assert [d.tokens for d in decoded] == workload.sessions


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="kernel / reference ratios are timed on a CUDA GPU only")
@pytest.mark.parametrize("op", KERNEL_OPS)
def test_kernel(request: pytest.FixtureRequest, op: str) -> None:
    from gpu_kernels import build_cases

    timed = timing_enabled(request.config)
    device = torch.device("cuda")
    cases = {case.op: case for case in build_cases(device, "full" if timed else "tiny")}
    case = cases[op]

    def run(provider: str) -> object:
        result = case.run(provider)
        torch.cuda.synchronize(device)
        return result

    reference = PairedReference(f"{op} torch", lambda: run("torch")) if timed else None
    time_ratio(request, reference, f"kernel[{op}] / reference", "kernel / reference",
               lambda: run("triton"), KERNEL_ROUNDS, warmup_rounds=3,
               extra={"op": op, "device": torch.cuda.get_device_name(device)})

"""Encode and decode speed of the codec, with its deterministic figures in ``extra_info``.

Run with ``.venv/bin/python -m pytest benchmarks --benchmark-enable`` (scripts/bench.sh). The
provider axis is the model: the tiny random Llama (coder and bookkeeping cost) and the embedded
SmolLM2-135M (real cost: one forward per token).
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import pytest

from seqkv import CompressResult, compress, decompress
from seqkv.models import CausalLM

_TOKENS = 128


def _tokens(model: CausalLM) -> list[int]:
    if model.tokenizer is None:
        return [(7 * i + 3) % model.vocab_size for i in range(_TOKENS)]
    text = (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8")
    return model.encode_text(text)[:_TOKENS]


@pytest.fixture(params=["tiny", "smollm2"])
def provider(request: pytest.FixtureRequest) -> CausalLM:
    fixture = "tiny_model" if request.param == "tiny" else "real_model"
    model: CausalLM = request.getfixturevalue(fixture)
    return model


def _record(benchmark: Any, model: CausalLM, result: CompressResult) -> None:
    stats = result.stats
    benchmark.extra_info.update({
        "model": model.name,
        "tokens": stats.tokens,
        "bits_per_token": stats.bits_per_token,
        "cross_entropy_bits_per_token": stats.cross_entropy_bits_per_token,
        "ratio_vs_fp16": stats.ratio_vs_fp16,
        "file_bytes": stats.file_bytes,
    })


def test_encode(benchmark: Any, provider: CausalLM) -> None:
    tokens = _tokens(provider)
    result = benchmark.pedantic(compress, args=(provider, tokens), rounds=2, iterations=1)
    _record(benchmark, provider, result)
    assert result.stats.tokens == len(tokens)


def test_decode(benchmark: Any, provider: CausalLM) -> None:
    tokens = _tokens(provider)
    result = compress(provider, tokens)
    decoded = benchmark.pedantic(decompress, args=(provider, result.data), rounds=2,
                                 iterations=1)
    _record(benchmark, provider, result)
    assert decoded.tokens == tokens

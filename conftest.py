"""Shared by tests/, research/ and benchmarks/: hypothesis profiles, one loaded model per
session, and the CLI on the tiny model."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=25, deadline=None)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


import pytest  # noqa: E402

from seqkv.models import CausalLM, tiny_random_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model() -> CausalLM:
    """A 2-layer random Llama (vocabulary 512): the fast tests' model."""
    return tiny_random_llama(seed=0)


# NOTE: a decoder's work is bounded by the token count a file states, and that count only by the
# model's context (an arithmetic code can hold many likely tokens in a few bytes). A forged
# count of 4,096 on the tiny model's full context took up to 110 s at the portable level on this
# machine; with 128 positions every fuzz case stays within the harness's per-case budget.
FUZZ_CONTEXT = 128


@pytest.fixture(scope="session")
def fuzz_model() -> CausalLM:
    """The tiny Llama with a 128-position context: the fuzz suites' model (see FUZZ_CONTEXT)."""
    return tiny_random_llama(seed=0, context=FUZZ_CONTEXT)


# NOTE: the tests' processes (and the ``seqkv`` processes they start) keep converted models in a
# cache of this session (``seqkv.models.gguf_cache``), never in the user's home; the session's
# model itself is converted from the GGUF file directly (the cache off), so that the cache's
# tests compare a cached load with the conversion, not with another cached load.
if "SEQKV_MODEL_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _MODEL_CACHE = tempfile.mkdtemp(prefix="seqkv-test-models-")
    os.environ["SEQKV_MODEL_CACHE"] = _MODEL_CACHE
    atexit.register(shutil.rmtree, _MODEL_CACHE, True)


@pytest.fixture(scope="session")
def real_model() -> CausalLM:
    """The embedded SmolLM2-135M-Instruct, converted from its GGUF file once for the whole test
    session (the model cache off)."""
    from seqkv.models import load_default_model

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEQKV_MODEL_CACHE", "off")
        return load_default_model()


class _TinyTokenizer:
    """Whitespace words to ids below the tiny model's vocabulary, and back."""

    def encode(self, text: str) -> list[int]:
        return [3 + sum(ord(c) for c in word) % 500 for word in text.split()]

    def decode(self, tokens: list[int]) -> str:
        return " ".join(f"w{t}" for t in tokens)


@pytest.fixture
def use_tiny(tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> CausalLM:
    """The CLI's model loads as the tiny model behind a whitespace tokenizer."""
    from seqkv import cli

    tokenizer = _TinyTokenizer()
    monkeypatch.setattr(cli.common, "load", lambda path: tiny_model)
    monkeypatch.setattr(tiny_model, "encode_text", tokenizer.encode)
    monkeypatch.setattr(tiny_model, "decode_tokens", tokenizer.decode)
    return tiny_model

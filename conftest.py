"""Shared by tests/ and benchmarks/: hypothesis profiles and one loaded model per session."""

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


@pytest.fixture(scope="session")
def real_model() -> CausalLM:
    """The embedded SmolLM2-135M-Instruct, loaded once for the whole test session."""
    from seqkv.models import load_default_model

    return load_default_model()

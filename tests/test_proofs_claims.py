"""Tests for seqkv.proofs.claims and the package as a whole: verdicts, doctests, hygiene."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import inspect
import types

import pytest

import seqkv.proofs
from seqkv.proofs import Claim, Measurements, paper_claims

MODULES = (
    "_exact",
    "claims",
    "information",
    "memory",
    "perplexity",
    "ratios",
    "storage",
    "theorem1",
)


# What a CPU run measures: each schedule repeats exactly, schedules differ, Theorem 1's
# inequality holds but a few tokens merge, and code length does not fall with position.
CPU_RUN = Measurements(deterministic_per_schedule=True, schedule_invariant=False,
                       kv_entropy_within_token_entropy=True,
                       kv_entropy_equals_token_entropy=False, entropy_falls_with_context=False)


def _claims(measured: Measurements = CPU_RUN) -> dict[str, Claim]:
    return {claim.name: claim for claim in paper_claims(measured)}


def test_claim_names() -> None:
    assert set(_claims()) == {
        "per_vector_bits_70b",
        "ratio_over_turboquant",
        "ratio_with_1000x_overhead",
        "ratio_for_real_70b",
        "ratio_grows_with_context",
        "fp16_kv_memory_70b_128k",
        "bits_at_perplexity_10",
        "bits_at_perplexity_20",
        "lemma1_determinism",
        "theorem1",
        "theorem1_equality",
        "prefix_storage_corollary",
    }


def test_ratio_claim_holds_with_caveats() -> None:
    claim = _claims()["ratio_over_turboquant"]
    assert claim.holds
    assert claim.paper_value == 914_000
    assert claim.derived_value == pytest.approx(914_455.8, abs=0.1)
    assert "per-component" in claim.note
    assert "64 KV heads" in claim.note
    assert "GQA" in claim.note


def test_overhead_claim_holds() -> None:
    claim = _claims()["ratio_with_1000x_overhead"]
    assert claim.holds
    assert claim.derived_value == pytest.approx(914.456, abs=1e-3)


def test_real_70b_ratio_does_not_hold() -> None:
    claim = _claims()["ratio_for_real_70b"]
    assert not claim.holds
    assert claim.derived_value == pytest.approx(114_306.98, abs=0.01)


def test_memory_claim_does_not_hold() -> None:
    claim = _claims()["fp16_kv_memory_70b_128k"]
    assert not claim.holds
    assert claim.paper_value == 80
    assert claim.derived_value == pytest.approx(335.5, abs=0.05)
    assert "41.9 GB" in claim.note


def test_perplexity_claims_hold() -> None:
    claims = _claims()
    assert claims["bits_at_perplexity_10"].holds
    assert claims["bits_at_perplexity_10"].derived_value == pytest.approx(3.3219, abs=1e-4)
    assert claims["bits_at_perplexity_20"].holds
    assert "cross-entropy" in claims["bits_at_perplexity_20"].note


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Measurements)])
def test_premise_bound_verdicts_follow_the_measurements(field: str) -> None:
    """No verdict is a literal: flipping one measurement flips the claims resting on it."""
    dependents = {
        "deterministic_per_schedule": {"lemma1_determinism"},
        "schedule_invariant": {"lemma1_determinism"},
        "kv_entropy_within_token_entropy": {"theorem1"},
        "kv_entropy_equals_token_entropy": {"theorem1_equality"},
        "entropy_falls_with_context": {"ratio_grows_with_context"},
    }[field]
    everything = Measurements(True, True, True, True, True)
    flipped = dataclasses.replace(everything, **{field: False})
    before, after = _claims(everything), _claims(flipped)
    assert all(before[name].holds for name in dependents)
    assert {name for name in before if before[name].holds != after[name].holds} == dependents


def test_theorem_and_storage_claims() -> None:
    claims = _claims()
    assert claims["theorem1"].holds and not claims["theorem1_equality"].holds
    assert not claims["lemma1_determinism"].holds
    assert "INJECTIVITY" in claims["theorem1"].note
    assert "schedule" in claims["lemma1_determinism"].note
    assert claims["prefix_storage_corollary"].holds
    assert "prefix" in claims["prefix_storage_corollary"].note


def test_every_claim_names_its_module() -> None:
    for claim in paper_claims(CPU_RUN):
        assert claim.checked_by.startswith("seqkv.proofs.")
        importlib.import_module(claim.checked_by)
        assert claim.note
        assert (claim.derived_value is None) == (claim.paper_value is None)


def test_claims_are_frozen_and_fresh() -> None:
    first, second = paper_claims(CPU_RUN), paper_claims(CPU_RUN)
    assert first == second
    assert first is not second
    assert not hasattr(first[0], "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        first[0].holds = False  # type: ignore[misc]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(f"seqkv.proofs.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0


def test_all_exports_exist_and_are_documented() -> None:
    for name in seqkv.proofs.__all__:
        value = getattr(seqkv.proofs, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name} has no docstring"


@pytest.mark.parametrize("name", MODULES)
def test_no_mutable_module_state(name: str) -> None:
    module = importlib.import_module(f"seqkv.proofs.{name}")
    assert module.__doc__
    for attr, value in vars(module).items():
        if attr.startswith("__") or isinstance(value, types.ModuleType):
            continue
        assert not isinstance(value, list | dict | set | bytearray), f"{name}.{attr} is mutable"


def test_dataclasses_are_slotted() -> None:
    for name in seqkv.proofs.__all__:
        value = getattr(seqkv.proofs, name)
        if inspect.isclass(value) and dataclasses.is_dataclass(value):
            params = value.__dataclass_params__  # type: ignore[attr-defined]
            assert params.frozen, f"{name} is not frozen"
            assert "__slots__" in vars(value), f"{name} is not slotted"

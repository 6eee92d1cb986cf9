"""Tests for seqkv.proofs.theorem1: the proof chain, its premises, and synthetic sources."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.errors import ProofInputError
from seqkv.proofs import (
    Premise,
    Relation,
    check_data_processing,
    check_theorem1,
    conditional_entropy_bits,
    injective_on_support,
    premise_spec,
    premise_specs,
    proof_steps,
    push_forward,
    theorem1_proof,
)
from seqkv.proofs.theorem1 import KV_NEXT, TOKEN_NEXT


@st.composite
def joints(draw: st.DrawFn, max_rows: int = 4, max_cols: int = 6) -> np.ndarray:
    """A full-support joint distribution, weights bounded away from 0 so gaps are not tiny."""
    rows = draw(st.integers(1, max_rows))
    cols = draw(st.integers(1, max_cols))
    weights = draw(st.lists(st.integers(1, 50), min_size=rows * cols, max_size=rows * cols))
    array = np.asarray(weights, dtype=np.float64).reshape(rows, cols)  # [rows, cols]
    normalised: np.ndarray = array / float(array.sum())
    return normalised


@st.composite
def joint_and_map(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    joint = draw(joints())
    rows, cols = joint.shape
    labels = draw(st.lists(st.integers(0, cols), min_size=rows * cols, max_size=rows * cols))
    return joint, np.asarray(labels, dtype=np.int64).reshape(rows, cols)  # [rows, cols]


def test_chain_connects_lhs_to_rhs() -> None:
    steps = proof_steps()
    assert steps[0].lhs == KV_NEXT
    assert steps[-1].rhs == TOKEN_NEXT
    for before, after in itertools.pairwise(steps):
        assert before.rhs == after.lhs
    assert [step.index for step in steps] == list(range(1, len(steps) + 1))


def test_only_data_processing_step_is_an_inequality() -> None:
    relations = [step.relation for step in proof_steps()]
    assert relations == [Relation.EQUAL, Relation.EQUAL, Relation.LESS_EQUAL]
    assert proof_steps()[2].equality_under == frozenset({Premise.INJECTIVITY})


def test_theorem_premises() -> None:
    theorem = theorem1_proof()
    assert theorem.statement == f"{KV_NEXT} <= {TOKEN_NEXT}"
    assert theorem.lhs == KV_NEXT
    assert theorem.rhs == TOKEN_NEXT
    assert theorem.premises_used == frozenset(Premise)
    assert theorem.equality_premises == frozenset({Premise.INJECTIVITY})
    # INJECTIVITY is used for the inequality itself (step 1), not only for equality.
    assert Premise.INJECTIVITY in proof_steps()[0].premises


def test_premise_specs_cover_every_premise() -> None:
    assert [spec.premise for spec in premise_specs()] == list(Premise)
    for spec in premise_specs():
        assert spec.statement
        assert spec.empirical_test
        assert spec.weak_point
        assert premise_spec(spec.premise) == spec


def test_determinism_names_schedules() -> None:
    spec = premise_spec(Premise.DETERMINISM)
    for word in ("prefill", "chunked", "token by token", "max"):
        assert word in spec.empirical_test
    assert "schedule" in spec.weak_point
    assert "1e-4" in spec.weak_point


def test_injectivity_test_is_pairwise_distance() -> None:
    spec = premise_spec(Premise.INJECTIVITY)
    assert "minimum pairwise distance" in spec.empirical_test
    assert "position > 0" in spec.empirical_test


def test_steps_are_frozen_and_slotted() -> None:
    step = proof_steps()[0]
    assert not hasattr(step, "__dict__")
    assert not hasattr(theorem1_proof(), "__dict__")
    with pytest.raises(AttributeError):
        step.index = 5  # type: ignore[misc]


@given(joint_and_map())
def test_data_processing_holds(case: tuple[np.ndarray, np.ndarray]) -> None:
    joint, labels = case
    check = check_data_processing(joint, labels)
    assert check.inequality_holds
    assert check.equality_holds == check.next_injective_on_support
    assert check.consistent_with_theorem


@given(joints(), st.data())
def test_injective_map_gives_equality(joint: np.ndarray, data: st.DataObject) -> None:
    cols = joint.shape[1]
    labels = data.draw(st.permutations(range(100, 100 + cols)))
    check = check_data_processing(joint, np.asarray(labels, dtype=np.int64))
    assert check.next_injective_on_support
    assert check.equality_holds


@given(joints(max_cols=5))
def test_merging_two_tokens_is_strict(joint: np.ndarray) -> None:
    cols = joint.shape[1]
    if cols < 2:
        return
    labels = np.arange(cols)
    labels[1] = labels[0]  # f merges tokens 0 and 1, both with positive probability
    check = check_data_processing(joint, labels)
    assert not check.next_injective_on_support
    assert check.lhs_bits < check.rhs_bits - 1e-6


@given(joint_and_map())
def test_theorem_holds_with_injective_prior_map(case: tuple[np.ndarray, np.ndarray]) -> None:
    joint, labels = case
    prior = np.arange(joint.shape[0]) * 7 + 3  # one-to-one, arbitrary labels
    check = check_theorem1(joint, prior, labels)
    assert check.prior_injective
    assert check.inequality_holds
    assert check.consistent_with_theorem


def test_theorem_fails_without_prior_injectivity() -> None:
    joint = [[0.5, 0.0], [0.0, 0.5]]  # next token = prefix
    check = check_theorem1(joint, prior_map=[0, 0], next_map=[0, 1])
    assert check.rhs_bits == 0.0
    assert check.lhs_bits == pytest.approx(1.0)
    assert not check.prior_injective
    assert not check.inequality_holds
    assert check.consistent_with_theorem  # the proof predicts nothing without its premise


def test_equality_iff_injective_on_support_not_everywhere() -> None:
    joint = [[0.5, 0.5, 0.0]]
    labels = [1, 2, 2]  # merges tokens 1 and 2, but token 2 never occurs
    check = check_data_processing(joint, labels)
    assert check.next_injective_on_support
    assert check.equality_holds


def test_push_forward_conserves_mass() -> None:
    joint = np.full((3, 4), 1 / 12)
    pushed = push_forward(joint, [0, 1, 0], [5, 5, 6, 7])
    assert pushed.shape == (2, 3)
    assert pushed.sum() == pytest.approx(1.0)
    assert conditional_entropy_bits(pushed) <= conditional_entropy_bits(joint)
    assert injective_on_support(joint, [0, 1, 2, 3])


def test_rejects_joint_not_summing_to_one() -> None:
    with pytest.raises(ProofInputError, match="sum to 1"):
        check_data_processing([[0.5, 0.6]], [0, 1])


def test_rejects_negative_joint() -> None:
    with pytest.raises(ProofInputError, match="negative"):
        check_data_processing([[1.5, -0.5]], [0, 1])


def test_rejects_one_dimensional_joint() -> None:
    with pytest.raises(ProofInputError, match="2 axes"):
        check_data_processing([0.5, 0.5], [0, 1])


def test_rejects_wrong_map_shape() -> None:
    with pytest.raises(ProofInputError, match="cell_map"):
        check_data_processing([[0.5, 0.5]], [0, 1, 2])


def test_rejects_wrong_prior_map_shape() -> None:
    with pytest.raises(ProofInputError, match="row_map"):
        check_theorem1([[0.5, 0.5]], prior_map=[0, 1], next_map=[0, 1])


def test_rejects_float_labels() -> None:
    with pytest.raises(ProofInputError, match="integer labels"):
        check_data_processing([[0.5, 0.5]], [0.0, 1.0])

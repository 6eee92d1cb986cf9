"""Theorem 1: the next KV vector carries no more information than the next token.

Paper: arXiv 2604.15356, Theorem 1,

    H(KV_{i+1} | KV_{<=i}) <= H(t_{i+1} | t_{<=i}),

with equality when the first-layer K/V projection is injective over token embeddings. The paper's
proof is "data-processing inequality, plus prior KV determines prior tokens". ``proof_steps``
spells it out as a chain of (in)equalities, each with its justification and the premises it uses.
Entropies are over any joint distribution of token sequences (the data source's, or the model's);
the inequality does not care which. Tokens come from a finite vocabulary, so given the prefix,
KV_{i+1} takes finitely many values and its discrete entropy is defined although its entries are
real numbers.

Premises (``Premise``):

1. DETERMINISM (assumed; Lemma 1). Fixed weights and deterministic inference:
   KV_i = F_M(t_1..t_i). Tested by running one prefix through several computation schedules (full
   prefill, chunked prefill, token by token) and reporting the max |difference| of KV and logits.
2. INJECTIVITY (assumed; claimed by the paper to hold generically). The first-layer K/V map,
   token embedding -> input norm -> K/V projection -> rotary position, is one-to-one over the
   vocabulary at every position, so the prior KV determines the prior tokens, and the new KV
   determines the new token. Tested by the minimum pairwise distance of first-layer K/V over all
   vocabulary entries at a position > 0 (zero means a collision).

Invariants of this module:

1. (checked) The steps form a chain: each step's right side is the next step's left side; the
   first left side is H(KV_{i+1} | KV_{<=i}) and the last right side H(t_{i+1} | t_{<=i}).
2. (checked) Only step 3 is an inequality, and it becomes an equality under INJECTIVITY.
3. (checked, numerically) ``check_theorem1`` computes both sides on finite synthetic sources;
   ``check_data_processing`` checks H(f(T) | C) <= H(T | C), with equality iff f is injective on
   the support of T given each C.

What the paper gets wrong, or leaves out:

- The inequality itself, not only the equality, rests on INJECTIVITY: the proof's "prior KV
  determines prior tokens" is that premise, which the paper only claims holds generically.
  Without it, KV_{<=i} may forget part of the prefix that KV_{i+1} reveals, and
  H(KV_{i+1} | KV_{<=i}) can exceed H(t_{i+1} | t_{<=i}) (``check_theorem1`` with a constant
  prior map shows it).
- DETERMINISM holds per computation schedule only. Full prefill and token-by-token decoding give
  different floats (max |logit difference| ~1e-4 measured on SmolLM2-135M, CPU), so F_M is one
  function per schedule. The theorem holds for each fixed schedule; an encoder and decoder that
  use different schedules are not covered, and an arithmetic coder over them desynchronises.
- Injectivity is a property of floating-point K/V values: two embeddings that collide after the
  input norm (e.g. one a positive multiple of another under RMSNorm) or round to one fp16 vector
  break it, so it must be measured in the dtype that is stored.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from seqkv.errors import ProofInputError

from .information import (
    as_distribution,
    conditional_entropy_bits,
    injective_on_support,
    is_injective,
    push_forward,
)

DEFAULT_ATOL = 1e-9
"""Absolute tolerance, in bits, for comparing two entropies computed in float64."""


class Premise(enum.Enum):
    """The named premises Theorem 1 rests on."""

    DETERMINISM = "determinism"
    INJECTIVITY = "injectivity"


class Relation(enum.Enum):
    """How a step's left side relates to its right side."""

    EQUAL = "="
    LESS_EQUAL = "<="


@dataclass(frozen=True, slots=True)
class PremiseSpec:
    """A premise: what it says, how to test it empirically, and where it is weak."""

    premise: Premise
    statement: str
    empirical_test: str
    weak_point: str


@dataclass(frozen=True, slots=True)
class ProofStep:
    """One link ``lhs relation rhs`` of the proof chain."""

    index: int
    lhs: str
    relation: Relation
    rhs: str
    justification: str
    premises: frozenset[Premise]
    equality_under: frozenset[Premise] = frozenset()  # premises that make a <= step an equality

    @property
    def statement(self) -> str:
        """The step as one line."""
        return f"{self.lhs} {self.relation.value} {self.rhs}"


@dataclass(frozen=True, slots=True)
class Theorem:
    """Theorem 1 with its proof."""

    statement: str
    equality_statement: str
    premises: tuple[PremiseSpec, ...]
    steps: tuple[ProofStep, ...]

    @property
    def lhs(self) -> str:
        """The theorem's left side."""
        return self.steps[0].lhs

    @property
    def rhs(self) -> str:
        """The theorem's right side."""
        return self.steps[-1].rhs

    @property
    def premises_used(self) -> frozenset[Premise]:
        """Every premise some step uses."""
        return frozenset().union(*(step.premises for step in self.steps))

    @property
    def equality_premises(self) -> frozenset[Premise]:
        """The premises under which every step is an equality (with ``premises_used``)."""
        return frozenset().union(*(step.equality_under for step in self.steps))


KV_NEXT = "H(KV_{i+1} | KV_{<=i})"
KV_NEXT_GIVEN_TOKENS = "H(KV_{i+1} | t_{<=i})"
F_GIVEN_TOKENS = "H(F_M(t_{<=i}, t_{i+1}) | t_{<=i})"
TOKEN_NEXT = "H(t_{i+1} | t_{<=i})"


def premise_specs() -> tuple[PremiseSpec, ...]:
    """The two premises, in ``Premise`` order.

    >>> [spec.premise.name for spec in premise_specs()]
    ['DETERMINISM', 'INJECTIVITY']
    """
    return (
        PremiseSpec(
            premise=Premise.DETERMINISM,
            statement=(
                "Lemma 1: with fixed weights and deterministic inference, the KV cache is a "
                "function of the token prefix, KV_i = F_M(t_1..t_i)."
            ),
            empirical_test=(
                "Run one prefix through several computation schedules (full prefill, chunked "
                "prefill, token by token) and report the max |difference| of every layer's K/V "
                "and of the logits; rerun one schedule to confirm it is bit-identical to itself."
            ),
            weak_point=(
                "Holds per computation schedule only: schedules differ in the last bits (max "
                "|logit difference| ~1e-4 on SmolLM2-135M, CPU), so the bound applies to a fixed "
                "schedule, and an arithmetic coder needs one schedule on both ends."
            ),
        ),
        PremiseSpec(
            premise=Premise.INJECTIVITY,
            statement=(
                "The first-layer K/V map (embedding, input norm, K/V projection, rotary position) "
                "is one-to-one over the vocabulary at each position, so the prior KV determines "
                "the prior tokens and the new KV determines the new token."
            ),
            empirical_test=(
                "For a position > 0, compute first-layer K and V for every vocabulary entry in "
                "the stored dtype and report the minimum pairwise distance; zero is a collision."
            ),
            weak_point=(
                "A floating-point property, claimed only 'generically': embeddings that coincide "
                "after the input norm, or round to one fp16 vector, break it. It carries the "
                "inequality too ('prior KV determines prior tokens'), not only the equality; "
                "without it the inequality can fail."
            ),
        ),
    )


def premise_spec(premise: Premise) -> PremiseSpec:
    """The ``PremiseSpec`` of ``premise``."""
    for spec in premise_specs():
        if spec.premise is premise:
            return spec
    raise ProofInputError(f"unknown premise {premise!r}")


def proof_steps() -> tuple[ProofStep, ...]:
    """The proof of Theorem 1 as a chain from its left side to its right side.

    >>> for step in proof_steps():
    ...     print(step.index, step.statement)
    1 H(KV_{i+1} | KV_{<=i}) = H(KV_{i+1} | t_{<=i})
    2 H(KV_{i+1} | t_{<=i}) = H(F_M(t_{<=i}, t_{i+1}) | t_{<=i})
    3 H(F_M(t_{<=i}, t_{i+1}) | t_{<=i}) <= H(t_{i+1} | t_{<=i})
    """
    determinism = frozenset({Premise.DETERMINISM})
    both = frozenset({Premise.DETERMINISM, Premise.INJECTIVITY})
    return (
        ProofStep(
            index=1,
            lhs=KV_NEXT,
            relation=Relation.EQUAL,
            rhs=KV_NEXT_GIVEN_TOKENS,
            justification=(
                "By DETERMINISM, KV_{<=i} = G(t_{<=i}) for a fixed function G. By INJECTIVITY, "
                "the first-layer K/V at each prior position identifies its token, so G is "
                "one-to-one and t_{<=i} = G^{-1}(KV_{<=i}). Each variable is a function of the "
                "other, so conditioning on either gives the same entropy. Without INJECTIVITY "
                "only H(KV_{i+1} | KV_{<=i}) >= H(KV_{i+1} | t_{<=i}) holds, the wrong way."
            ),
            premises=both,
        ),
        ProofStep(
            index=2,
            lhs=KV_NEXT_GIVEN_TOKENS,
            relation=Relation.EQUAL,
            rhs=F_GIVEN_TOKENS,
            justification="By DETERMINISM (Lemma 1), KV_{i+1} = F_M(t_{<=i}, t_{i+1}).",
            premises=determinism,
        ),
        ProofStep(
            index=3,
            lhs=F_GIVEN_TOKENS,
            relation=Relation.LESS_EQUAL,
            rhs=TOKEN_NEXT,
            justification=(
                "Data processing: for each prefix value p, F_M(p, .) is a function of the "
                "discrete t_{i+1}, and H(g(X)) <= H(X) with equality iff g is one-to-one on the "
                "support of X; average over p. Under INJECTIVITY the first-layer K/V part of "
                "KV_{i+1} already identifies t_{i+1}, so F_M(p, .) is one-to-one: equality."
            ),
            premises=determinism,
            equality_under=frozenset({Premise.INJECTIVITY}),
        ),
    )


def theorem1_proof() -> Theorem:
    """Theorem 1, its premises and its proof.

    >>> theorem = theorem1_proof()
    >>> theorem.statement
    'H(KV_{i+1} | KV_{<=i}) <= H(t_{i+1} | t_{<=i})'
    >>> sorted(premise.name for premise in theorem.premises_used)
    ['DETERMINISM', 'INJECTIVITY']
    """
    return Theorem(
        statement=f"{KV_NEXT} <= {TOKEN_NEXT}",
        equality_statement=f"{KV_NEXT} = {TOKEN_NEXT} under INJECTIVITY",
        premises=premise_specs(),
        steps=proof_steps(),
    )


@dataclass(frozen=True, slots=True)
class Theorem1Check:
    """Both sides of Theorem 1 on a finite synthetic source, and the verdicts."""

    lhs_bits: float  # H(F(P, T) | g(P)): next KV given prior KV
    rhs_bits: float  # H(T | P): next token given prefix
    prior_injective: bool  # g one-to-one: prior KV determines the prefix
    next_injective_on_support: bool  # F(p, .) one-to-one on the support of T given p
    atol: float

    @property
    def inequality_holds(self) -> bool:
        """lhs <= rhs within ``atol``."""
        return self.lhs_bits <= self.rhs_bits + self.atol

    @property
    def equality_holds(self) -> bool:
        """lhs == rhs within ``atol``."""
        return abs(self.lhs_bits - self.rhs_bits) <= self.atol

    @property
    def consistent_with_theorem(self) -> bool:
        """Whether this source agrees with what the proof predicts.

        With a one-to-one prior map, the inequality must hold, with equality exactly when the
        next map is one-to-one on the support. Without one, the proof predicts nothing.
        """
        if not self.prior_injective:
            return True
        return self.inequality_holds and self.equality_holds == self.next_injective_on_support


def check_theorem1(
    joint: npt.ArrayLike,
    prior_map: npt.ArrayLike,
    next_map: npt.ArrayLike,
    atol: float = DEFAULT_ATOL,
) -> Theorem1Check:
    """Compute both sides of Theorem 1 for a finite source.

    ``joint[p, t]`` is P(prefix = p, next token = t); ``prior_map[p]`` labels the prior KV of
    prefix p (KV_{<=i} = g(p)); ``next_map[p, t]`` (or ``next_map[t]``) labels the next KV
    (KV_{i+1} = F(p, t)).

    >>> joint = [[0.5, 0.0], [0.0, 0.5]]  # the next token equals the prefix: H(T | P) = 0
    >>> check_theorem1(joint, prior_map=[0, 1], next_map=[0, 1]).inequality_holds
    True
    >>> check_theorem1(joint, prior_map=[0, 0], next_map=[0, 1]).inequality_holds  # not injective
    False
    """
    array = as_distribution(joint, name="joint", ndim=2)
    rows = array.shape[0]
    pushed = push_forward(array, prior_map, next_map)  # [distinct g labels, distinct F labels]
    return Theorem1Check(
        lhs_bits=conditional_entropy_bits(pushed),
        rhs_bits=conditional_entropy_bits(array),
        prior_injective=is_injective(np.asarray(prior_map).reshape(rows)),
        next_injective_on_support=injective_on_support(array, next_map),
        atol=atol,
    )


def check_data_processing(
    joint: npt.ArrayLike, f: npt.ArrayLike, atol: float = DEFAULT_ATOL
) -> Theorem1Check:
    """Check H(f(T) | C) <= H(T | C), equality iff f is one-to-one on the support of T given C.

    ``joint[c, t]`` is P(C = c, T = t); ``f[t]`` (or ``f[c, t]``) labels f's output. This is
    step 3 of the proof alone (the conditioning variable is kept as is).

    >>> joint = [[0.25, 0.25], [0.25, 0.25]]
    >>> check = check_data_processing(joint, f=[0, 0])
    >>> check.lhs_bits, check.rhs_bits, check.equality_holds
    (0.0, 1.0, False)
    """
    array = as_distribution(joint, name="joint", ndim=2)
    identity = np.arange(array.shape[0], dtype=np.int64)
    return check_theorem1(array, identity, f, atol)

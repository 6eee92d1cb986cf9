"""An exact mixer: the base model's table refined by what the model cannot see, bit-identically.

The base predictor (the transformer, or any integer model) gives a cumulative table over the whole
vocabulary. The predictors of ``seqkv.mixing.match`` (a match model over the dictionary, the
dictionary's most frequent follower of the last two tokens, optionally a match model over the
session) each name at most one candidate token. For every candidate the mixer makes a binary
decision "is the next token this one?": its probability is the squashed dot product of learned
weights with the candidate's inputs (the stretch of the base's probability, of each naming
predictor's adaptive confidence, and a bias), with one weight set per set of predictors naming
the candidate, learned online by gradient steps on the coding loss. An optional APM (adaptive
probability map) refines that probability. The candidates get these probabilities; every other
token keeps the base's probability rescaled to the mass that is left. A final switch mixes that
table with the base's own table by weights that follow each one's coding success (fixed-share
Bayes), so the mixer never costs much more than the base alone.

Regret bound (against the base table, any tokens, any dictionary): with ``w0 = 1/2`` the switch's
initial base weight, the code length of the mixed tables is at most

    base + log2(1/w0) + shared + sum_t log2(y_t / floor(y_t))

where ``shared <= 8 + 0.0005 * base`` bits is what sharing weight cost (a ledger allows a share
step only while it stays within that budget; each step costs at most ``SHARE_COST`` units of
2**-24 bit) and ``y_t >= 1`` is the switch's unrounded count for the coded token: each rounding
term is at most 1 bit and below 1.45 / (y_t - 1) bits, under 4e-4 bits once y_t > 2**12 (a
probability above 2**-20). Hence at most ``1.0005 * base + 9`` bits plus that rounding: within the
target of ``1.001 * base + 16`` bits.

Fixed point (``seqkv.mixing.fixedpoint``): probabilities are counts out of 2**32, stretch values
in 1/4096 bit of log2-odds, weights in 1/65536. Table arithmetic on the whole vocabulary is
numpy uint64 products of two 32-bit values, floor divisions and shifts; no float touches a table.

Invariants:
1. ``table`` and ``update`` depend only on the base tables and tokens given so far (and on the
   dictionary), in integer arithmetic (enforced), so the decoder, calling them in the same order,
   computes the encoder's tables bit for bit (tested).
2. Every output table has every count >= 1 and total 2**32 (enforced, asserted).
3. When no predictor names a candidate the output is the base table itself (enforced).
4. The switch's base weight never drops below its Bayes posterior times ``(1 - 2**-share_shift)``
   per shared step, and it rounds in the base's favour (enforced): the regret bound above.
5. ``update`` mutates the predictor only; the dictionary index is shared and never mutated.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import numpy.typing as npt

from seqkv.coding.frequencies import CumulativeTable
from seqkv.errors import InvalidTensorError, InvalidTokensError
from seqkv.mixing.dictionary import Dictionary
from seqkv.mixing.errors import DictionaryMismatchError, MixerConfigError
from seqkv.mixing.fixedpoint import ONE, STRETCH_LIMIT, TOTAL, FixedPoint
from seqkv.mixing.match import (
    Confidence,
    DictionaryIndex,
    DictionaryNgram,
    MatchModel,
    Prediction,
    Predictor,
    SessionSource,
)

# NOTE: bump whenever any table the mixer computes could change for the same inputs: files record
# it (``MixerConfig.fingerprint``) and a decoder must refuse another version.
MIXER_VERSION = 1
_WEIGHT_ONE = 1 << 16
_WEIGHT_LIMIT = 16 * _WEIGHT_ONE
_SWITCH_BITS = 31
_SWITCH_ONE = 1 << _SWITCH_BITS
_LEDGER_ONE = 1 << 24  # ledger units per bit
# NOTE: -log2(1 - 2**-s) in ledger units, rounded up (12: 3.5227e-4 bits = 5910.0004 units);
# the tests recompute every entry.
SHARE_COST = {10: 23_649, 11: 11_822, 12: 5_911, 13: 2_955, 14: 1_478}
_LEDGER_GRACE = 8 * _LEDGER_ONE
_LEDGER_RATE = 2000  # the ledger earns 1/2000 of the base's code length
_APM_KNOTS = 33
_APM_STEP = 2 * ONE  # knots every 2 bits of log2-odds, from -32 to +32
# Mixer inputs: the base's stretch, one per predictor, a bias.
_DICTIONARY_MATCH, _DICTIONARY_NGRAM, _SESSION_MATCH, _BIAS_INPUT = 1, 2, 3, 4
_INPUTS = 5
_WEIGHT_SETS = 1 << (_INPUTS - 2)  # one per set of predictors naming the candidate
_BIAS = ONE


@dataclass(frozen=True)
class MixerConfig:
    """The mixer's settings. Encoder and decoder must use equal configs (part of a level's id).

    Defaults are the measured choices on the RAG bench (``research.bench.mix``, SmolLM2-135M base);
    most knobs changed the result by under 0.5% there.
    """

    dictionary_match: bool = True
    # NOTE: the dictionary's two-token followers saved 1.7% of the mixed code on sessions that
    # quote it (they name a candidate before a match of min_match tokens exists, and in template
    # text between quotes).
    dictionary_ngram: bool = True
    # NOTE: off by default: a match model over the session's own tokens cost 0.0-0.2% on every
    # measured text (the model already copies from its context); kept for other workloads.
    session_match: bool = False
    # NOTE: off by default: the APM changed the RAG bench by -0.06% to +0.1% (contexts by
    # predictor set or by match length, rates 2**-5 to 2**-7, weights 1/2 to 3/4): the
    # predictors' own adaptive confidences are already calibrated, and a session is too short to
    # train 33 knots per context. Kept as an option, exact and tested like the rest.
    apm: bool = False
    # NOTE: 3 tokens of context before a match counts: 2 saved 0.4% more on the bench, 4 cost
    # 1.5% and 6 cost 4% (later starts into each quote); 3 fires less on common phrases in a
    # large dictionary.
    min_match: int = 3
    session_min_match: int = 3
    # Learning rate of the mixer weights in 1/1024: weights move by rate * error * input bits
    # (4 to 64 measured within 0.5%).
    learning_rate: int = 16
    apm_rate_shift: int = 6
    # The switch moves 2**-share_shift of each weight to the other after each token.
    share_shift: int = 12
    # Initial weights (base, dictionary match, dictionary n-gram, session match, bias) in 1/65536.
    initial_weights: tuple[int, int, int, int, int] = (
        _WEIGHT_ONE // 4, _WEIGHT_ONE, _WEIGHT_ONE // 4, _WEIGHT_ONE // 2, 0)

    def fingerprint(self) -> str:
        """A canonical string of the algorithm version and every setting, for a file header.

        >>> MixerConfig().fingerprint()[:60]
        'mixer1;dictionary_match=1;dictionary_ngram=1;session_match=0'
        """
        settings = []
        for setting in fields(self):
            value = getattr(self, setting.name)
            if isinstance(value, tuple):
                text = ",".join(str(int(v)) for v in value)
            else:
                text = str(int(value))
            settings.append(f"{setting.name}={text}")
        return ";".join([f"mixer{MIXER_VERSION}", *settings])

    def __post_init__(self) -> None:
        if self.share_shift not in SHARE_COST:
            raise MixerConfigError(f"share_shift must be one of {sorted(SHARE_COST)}")
        if self.min_match < 1 or self.session_min_match < 1:
            raise MixerConfigError("match lengths must be at least 1 token")
        if len(self.initial_weights) != _INPUTS:
            raise MixerConfigError(f"initial_weights needs {_INPUTS} entries")


@dataclass(frozen=True, slots=True)
class _Slot:
    """One predictor feeding the mixer: its input index and its confidence."""

    input: int
    predictor: Predictor
    confidence: Confidence


@dataclass(slots=True)
class _Candidate:
    token: int
    inputs: list[int]
    sources: int = 0  # bit (input - 1) set when that predictor names the candidate
    mixed: int = 0  # the mixer's probability, counts out of 2**32
    refined: int = 0  # after the APM
    apm_index: int = 0
    apm_weight: int = 0


@dataclass(slots=True)
class _Pending:
    """What ``table`` decided, kept for ``update`` to learn from."""

    base_counts: npt.NDArray[np.int64]
    mixed_counts: npt.NDArray[np.int64] | None
    candidates: list[_Candidate]
    predictions: list[tuple[_Slot, Prediction]] = field(default_factory=list)


class Switch:
    """Fixed-share Bayes over two experts (base, mixed), with a regret ledger.

    ``mixed_weight`` is the mixed table's share in 1/2**31. After each token both weights become
    their posterior (the base's rounded up); then, if the ledger allows, 2**-share_shift of each
    weight moves to the other.
    """

    def __init__(self, share_shift: int, fixed: FixedPoint) -> None:
        self.mixed_weight = _SWITCH_ONE // 2
        self.share_shift = share_shift
        self._share_cost = SHARE_COST[share_shift]
        self._fixed = fixed
        self.spent = 0  # ledger units spent on sharing
        self.earned = 0  # ledger units of base code length (a lower bound)

    def combine(self, base: npt.NDArray[np.int64], mixed: npt.NDArray[np.int64]
                ) -> npt.NDArray[np.int64]:
        """floor((w_base * base + w_mixed * mixed) / 2**31), then settled on the total."""
        weight = np.uint64(self.mixed_weight)
        rest = np.uint64(_SWITCH_ONE - self.mixed_weight)
        combined = (base.astype(np.uint64) * rest + mixed.astype(np.uint64) * weight) >> np.uint64(
            _SWITCH_BITS)
        return _settle(combined.astype(np.int64))

    def update(self, base_count: int, mixed_count: int) -> None:
        base_weight = _SWITCH_ONE - self.mixed_weight
        evidence_base = base_weight * base_count
        evidence = evidence_base + self.mixed_weight * mixed_count
        base_weight = -(-(evidence_base << _SWITCH_BITS) // evidence)  # posterior, rounded up
        mixed_weight = _SWITCH_ONE - base_weight
        cost = (32 * ONE - self._fixed.log2_fixed(base_count) - 2) << 12  # <= base's cost
        self.earned += max(0, cost)
        if self.spent + self._share_cost <= _LEDGER_GRACE + self.earned // _LEDGER_RATE:
            self.spent += self._share_cost
            shift = self.share_shift
            base_weight += (mixed_weight >> shift) - (base_weight >> shift)
        self.mixed_weight = _SWITCH_ONE - base_weight


class Apm:
    """An adaptive probability map: a probability refined by interpolating learned knots."""

    def __init__(self, contexts: int, rate_shift: int, fixed: FixedPoint) -> None:
        knots = [fixed.squash((k - _APM_KNOTS // 2) * _APM_STEP) for k in range(_APM_KNOTS)]
        self.knots = [list(knots) for _ in range(contexts)]
        self.rate_shift = rate_shift

    def refine(self, context: int, stretch: int) -> tuple[int, int, int]:
        """(probability, knot index, weight of the upper knot in 1/_APM_STEP)."""
        position = max(0, min(stretch + STRETCH_LIMIT, 2 * STRETCH_LIMIT - 1))
        index, weight = divmod(position, _APM_STEP)
        knots = self.knots[context]
        value = (knots[index] * (_APM_STEP - weight) + knots[index + 1] * weight) // _APM_STEP
        return value, index, weight

    def update(self, context: int, index: int, weight: int, hit: bool) -> None:
        target = TOTAL - 1 if hit else 1
        knots = self.knots[context]
        for knot, share in ((index, _APM_STEP - weight), (index + 1, weight)):
            knots[knot] += (target - knots[knot]) * share // (_APM_STEP << self.rate_shift)


class MixingPredictor:
    """The base table mixed with the dictionary's predictors (and optionally a session match).

    Call ``table(base)`` for the next position, code the token under the result, then
    ``update(token)``; the decoder calls the same methods in the same order. The predictor keeps
    the history itself (every token passes through ``update`` or ``prime``). ``prime`` feeds
    context tokens that are not coded (a shared prefix). A ``DictionaryIndex`` may be shared by
    many predictors; pass a ``FixedPoint`` to share its table too.

    >>> import numpy as np
    >>> from seqkv.coding.frequencies import uniform_cumulative
    >>> predictor = MixingPredictor(None, vocab_size=8)
    >>> base = uniform_cumulative(8)
    >>> bool(np.array_equal(predictor.table(base), base))  # nothing to add yet
    True
    """

    def __init__(self, dictionary: Dictionary | DictionaryIndex | None, vocab_size: int,
                 config: MixerConfig | None = None, fixed: FixedPoint | None = None) -> None:
        self.config = config = config or MixerConfig()
        self.vocab_size = vocab_size
        self._fixed = fixed = fixed or FixedPoint.build()
        if isinstance(dictionary, Dictionary):
            dictionary = DictionaryIndex(dictionary, config.min_match)
        if dictionary is not None:
            if dictionary.dictionary.vocab_size != vocab_size:
                raise DictionaryMismatchError(
                    f"the dictionary is for a vocabulary of {dictionary.dictionary.vocab_size} "
                    f"tokens, the base model has {vocab_size}: use the model's dictionary")
            if dictionary.min_length != config.min_match:
                raise MixerConfigError(
                    f"the dictionary index uses {dictionary.min_length}-token windows, the "
                    f"config {config.min_match}: build the index with the config's min_match")
        self.index = dictionary
        self._session = SessionSource(config.session_min_match)
        self._slots: list[_Slot] = []
        if dictionary is not None and config.dictionary_match:
            self._slots.append(_Slot(_DICTIONARY_MATCH, MatchModel(dictionary, config.min_match),
                                     Confidence()))
        if dictionary is not None and config.dictionary_ngram:
            self._slots.append(_Slot(_DICTIONARY_NGRAM, DictionaryNgram(dictionary),
                                     Confidence()))
        if config.session_match:
            self._slots.append(_Slot(_SESSION_MATCH,
                                     MatchModel(self._session, config.session_min_match),
                                     Confidence()))
        self._weights = [list(config.initial_weights) for _ in range(_WEIGHT_SETS)]
        self._apm = Apm(_WEIGHT_SETS, config.apm_rate_shift, fixed)
        self.switch = Switch(config.share_shift, fixed)
        self._pending: _Pending | None = None

    @property
    def history(self) -> list[int]:
        """Every token seen so far (primed and coded), oldest first."""
        return self._session.tokens

    def prime(self, tokens: Iterable[int]) -> None:
        """Feed context tokens that are not coded (e.g. a shared prefix)."""
        for token in tokens:
            self._check_token(int(token))
            self._pending = None
            self._advance(int(token))

    def table(self, base: CumulativeTable) -> CumulativeTable:
        """The mixed cumulative table for the next token, given the base's table."""
        if base.shape != (self.vocab_size + 1,) or base[0] != 0 or base[-1] != TOTAL:
            raise InvalidTensorError(
                f"expected a cumulative table of {self.vocab_size + 1} entries from 0 to 2**32, "
                f"got shape {base.shape}")
        counts = np.diff(base)
        if int(counts.min()) < 1:
            raise InvalidTensorError(
                "the base table gives a token a count of 0: every count must be >= 1"
            )
        candidates, predictions = self._candidates(counts)
        if not candidates:
            self._pending = _Pending(counts, None, [], predictions)
            return base
        mixed = self._mixed_counts(counts, candidates)
        self._pending = _Pending(counts, mixed, candidates, predictions)
        final = self.switch.combine(counts, mixed)
        cumulative = np.zeros(self.vocab_size + 1, dtype=np.int64)
        np.cumsum(final, out=cumulative[1:])
        return cumulative

    def update(self, token: int) -> None:
        """Learn from the coded ``token`` and move to the next position."""
        self._check_token(token)
        pending, self._pending = self._pending, None
        if pending is not None:
            self._learn(pending, token)
        self._advance(token)

    def _check_token(self, token: int) -> None:
        if not 0 <= token < self.vocab_size:
            raise InvalidTokensError(
                f"token {token} is outside the vocabulary of {self.vocab_size}: pass ids of the "
                "tokenizer the mixer was built for"
            )

    def _advance(self, token: int) -> None:
        self._session.append(token)
        history = self._session.tokens
        for slot in self._slots:
            slot.predictor.update(history, token)

    def _candidates(self, counts: npt.NDArray[np.int64]
                    ) -> tuple[list[_Candidate], list[tuple[_Slot, Prediction]]]:
        predictions: list[tuple[_Slot, Prediction]] = []
        found: dict[int, _Candidate] = {}
        fixed = self._fixed
        for slot in self._slots:
            prediction = slot.predictor.prediction()
            if prediction is None:
                continue
            predictions.append((slot, prediction))
            candidate = found.get(prediction.token)
            if candidate is None:
                inputs = [0] * _INPUTS
                inputs[0] = fixed.stretch(int(counts[prediction.token]))
                inputs[_BIAS_INPUT] = _BIAS
                candidate = found[prediction.token] = _Candidate(prediction.token, inputs)
            confidence = slot.confidence.probability[prediction.context]
            candidate.inputs[slot.input] = fixed.stretch(confidence)
            candidate.sources |= 1 << (slot.input - 1)
        return list(found.values()), predictions

    def _mixed_counts(self, counts: npt.NDArray[np.int64], candidates: list[_Candidate]
                      ) -> npt.NDArray[np.int64]:
        fixed = self._fixed
        for candidate in candidates:
            weights = self._weights[candidate.sources]
            dot = sum(w * x for w, x in zip(weights, candidate.inputs, strict=True))
            stretch = max(-STRETCH_LIMIT, min(STRETCH_LIMIT, dot >> 16))
            candidate.mixed = fixed.squash(stretch)
            if self.config.apm:
                refined, candidate.apm_index, candidate.apm_weight = self._apm.refine(
                    candidate.sources, stretch)
                candidate.refined = max(1, (candidate.mixed + 3 * refined) >> 2)
            else:
                candidate.refined = candidate.mixed
        vocab = self.vocab_size
        chosen = [candidate.token for candidate in candidates]
        # NOTE: the candidates together keep at most 1 - 2**-12 of the mass (3.5e-4 bits is the
        # least a candidate can cost) and leave every other token a count of at least 1.
        cap = TOTAL - max(TOTAL >> 12, 2 * vocab)
        total = sum(candidate.refined for candidate in candidates)
        if total > cap:
            for candidate in candidates:
                candidate.refined = max(1, candidate.refined * cap // total)
            total = sum(candidate.refined for candidate in candidates)
        left = TOTAL - total - (vocab - len(candidates))  # mass to share after a floor of 1 each
        base_left = TOTAL - int(counts[chosen].sum())
        if base_left:
            # Products of two values below 2**32 fit uint64 exactly.
            wide = counts.astype(np.uint64) * np.uint64(left)
            result = (wide // np.uint64(base_left) + np.uint64(1)).astype(np.int64)
        else:  # every token is a candidate
            result = np.zeros(vocab, dtype=np.int64)
        result[chosen] = [candidate.refined for candidate in candidates]
        return _settle(result)

    def _learn(self, pending: _Pending, token: int) -> None:
        config = self.config
        for slot, prediction in pending.predictions:
            slot.confidence.update(prediction.context, prediction.token == token)
        rate = config.learning_rate
        for candidate in pending.candidates:
            hit = candidate.token == token
            error = (TOTAL if hit else 0) - candidate.mixed
            weights = self._weights[candidate.sources]
            for i, x in enumerate(candidate.inputs):
                # error * x * rate / 1024 in weight units: 2**16 / (2**32 * 2**12 * 2**10)
                step = (error * x * rate) >> 38
                weights[i] = max(-_WEIGHT_LIMIT, min(_WEIGHT_LIMIT, weights[i] + step))
            if config.apm:
                self._apm.update(candidate.sources, candidate.apm_index, candidate.apm_weight,
                                 hit)
        mixed = pending.mixed_counts
        base_count = int(pending.base_counts[token])
        self.switch.update(base_count, base_count if mixed is None else int(mixed[token]))


def _settle(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Give the counts' deficit below 2**32 (never negative here) to the largest count."""
    deficit = TOTAL - int(counts.sum())
    assert deficit >= 0, "the counts exceed the total"
    counts[int(np.argmax(counts))] += deficit
    assert int(counts.min()) >= 1
    return counts


def mixed_tables(predictor: MixingPredictor, base_tables: Iterable[CumulativeTable],
                 tokens: Sequence[int]) -> Iterator[CumulativeTable]:
    """The encoder's run: the mixed table of each position, given every position's base table.

    The decoder reaches the same tables by calling ``table`` and ``update`` itself as it decodes.
    """
    for base, token in zip(base_tables, tokens, strict=True):
        yield predictor.table(base)
        predictor.update(token)


def code_length_bits(tables: Iterable[CumulativeTable], tokens: Sequence[int]) -> float:
    """Sum of -log2(count / 2**32) of each token under its table."""
    total = 0.0
    for table, token in zip(tables, tokens, strict=True):
        total += 32.0 - float(np.log2(int(table[token + 1] - table[token])))
    return total

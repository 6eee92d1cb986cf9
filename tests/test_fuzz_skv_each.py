"""The long run's .skv format-3 structural fuzzing, one test per original file.

``tests/test_fuzz_skv.py::test_fuzz_format_3_structure`` runs every original in one test and
stops at the first tally that fails its check, so in a long run one slow case hides the other
originals' figures. ``scripts/fuzz.sh`` runs this module instead (same originals, mutations,
seeds and tally names): each original is its own test, and each writes its tally. Without
``SEQKV_FUZZ_CASES`` (the CI run) it is skipped, as the CI cases are
``test_fuzz_skv.py``'s.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from seqkv.descriptions import Descriptions
from seqkv.formats.framing import unframe
from seqkv.formats.skv import _ERRORS, FORMAT_VERSION, MAGIC
from seqkv.models import CausalLM
from test_fuzz_harness import CASES_ENV, Tally, case_count, mutate_framed, seed
from test_fuzz_skv import Original, _attempt, originals, skv_fields

__all__ = ["originals"]  # the fixture, shared with test_fuzz_skv.py

ORIGINALS = ("tokens", "tokens-1e-5", "tokens-bitexact", "rows", "segments-3", "ngram", "plain",
             "portable", "prefix")

pytestmark = pytest.mark.skipif(CASES_ENV not in os.environ,
                                reason="the long run's (scripts/fuzz.sh); CI runs test_fuzz_skv.py")


def test_the_originals_are_those_of_test_fuzz_skv(originals: list[Original]) -> None:
    assert tuple(o.name for o in originals) == ORIGINALS


@pytest.mark.parametrize("name", ORIGINALS)
def test_fuzz_format_3_structure(fuzz_model: CausalLM, originals: list[Original],
                                 tmp_path: Path, name: str) -> None:
    descriptions = Descriptions(tmp_path)
    number = ORIGINALS.index(name)
    original = originals[number]
    tally = Tally(f"skv-format3-{original.name}")
    rng = np.random.default_rng(seed(100 + number))  # test_fuzz_skv.py's seed for it
    _, sections = unframe(original.data, MAGIC, (FORMAT_VERSION,), _ERRORS, "fixture")
    fields = skv_fields(sections)
    for _ in range(case_count(40)):
        what, data = mutate_framed(rng, sections, MAGIC, FORMAT_VERSION, fields)
        tally.run(what, partial(_attempt, fuzz_model, original, data, descriptions))
    tally.check()

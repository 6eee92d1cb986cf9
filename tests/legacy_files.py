"""The committed files of formats 1 and 2 (``tests/data/legacy``), and what a decoder must do
with each on the machine the tests run on.

The files were coded under one machine's float profile. A file whose level's tokens are
portable (model-free, or integer-coded) decodes on every machine. A float-level file decodes
exactly where this machine's execution profile is the one the file records, and is refused by
name (``EnvironmentMismatchError``) everywhere else: the tests decide which by the decoder's
own comparison (``seqkv.codec.reproduces_profile``), never by naming a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqkv import decompress
from seqkv.codec import level_of, reproduces_profile
from seqkv.descriptions import DescriptionSource
from seqkv.errors import EnvironmentMismatchError
from seqkv.formats.skv import read_skv
from seqkv.models import CausalLM
from seqkv.models.profiles import reader_side

LEGACY = Path(__file__).parent / "data" / "legacy"
# What every file decodes to (tiny_random_llama(seed=0))
LEGACY_TOKENS: list[int] = json.loads((LEGACY / "tokens.json").read_text())


def must_decode_here(model: CausalLM, data: bytes) -> bool:
    """Whether this machine's decoder must decode the file: its level's tokens are portable,
    or the float profile it records is this machine's. Formats 1 and 2 predate the CPU model
    in the profile: read as the decoder reads them, it is this machine's where the rest is."""
    session = read_skv(data, reader_side(model)).session
    return level_of(session).spec.portable or reproduces_profile(model, session)


def assert_refused(model: CausalLM, data: bytes,
                   descriptions: DescriptionSource | None = None) -> None:
    """The decoder refuses the file by name and says which fields of the profile differ (from
    the file's own description, or from ``descriptions``)."""
    with pytest.raises(EnvironmentMismatchError, match=r"\w: file has .+, this machine "):
        decompress(model, data, descriptions=descriptions)

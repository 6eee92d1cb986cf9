"""The description registry: entries round-trip, and every damaged or hostile entry is absent.

``seqkv.descriptions`` reads files other processes (or people) may have written: an entry is
used only when it is flat JSON within 64 KiB, its fields are exactly the description's, each of
its declared type, and its content has the digest its name says. Anything else reads as absent
(the decoder then names digests instead of fields), never as an exception.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.descriptions import Descriptions
from seqkv.digests import model_digest, profile_digest
from seqkv.types import ExecutionProfile, ModelIdentity

MODEL = ModelIdentity("tiny", "a" * 64, "b" * 64, None)
PROFILE = ExecutionProfile("rows", "float32", "cpu", "AVX512", 1, "2.13.0", "5.24.0",
                           "genuineintel-6-207", 16)


def _registry(tmp_path: Path) -> Descriptions:
    descriptions = Descriptions(tmp_path)
    descriptions.remember(MODEL, PROFILE)
    return descriptions


def test_entries_round_trip(tmp_path: Path) -> None:
    descriptions = _registry(tmp_path)
    assert descriptions.model(model_digest(MODEL)) == MODEL
    assert descriptions.profile(profile_digest(PROFILE)) == PROFILE


def test_an_unknown_digest_is_absent(tmp_path: Path) -> None:
    descriptions = _registry(tmp_path)
    assert descriptions.model(model_digest(replace(MODEL, weights_sha256="c" * 64))) is None


def _overwrite_model(tmp_path: Path, content: bytes) -> Descriptions:
    descriptions = _registry(tmp_path)
    (tmp_path / "models" / f"{model_digest(MODEL).hex()}.json").write_bytes(content)
    return descriptions


HOSTILE = {
    "not JSON": b"\x89\x00garbage",
    "empty": b"",
    "a list": b"[1, 2]",
    "nested": json.dumps({**asdict(MODEL), "name": {"deep": [1]}}).encode(),
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "NaN": json.dumps({**asdict(MODEL), "name": float("nan")}).encode(),
    "a missing field": json.dumps({k: v for k, v in asdict(MODEL).items()
                                   if k != "weights_sha256"}).encode(),
    "an extra field": json.dumps({**asdict(MODEL), "extra": "x"}).encode(),
    "a wrong type": json.dumps({**asdict(MODEL), "config_sha256": 7}).encode(),
    "repeated keys": b'{"name": "tiny", "name": "tiny", "config_sha256": "", '
                     b'"weights_sha256": "", "tokenizer_sha256": null}',
    "over 64 KiB": json.dumps({**asdict(MODEL), "name": "x" * 70_000}).encode(),
    "another model's content": json.dumps(asdict(replace(MODEL, weights_sha256="c" * 64))).encode(),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_model_entry_is_absent(tmp_path: Path, kind: str) -> None:
    assert _overwrite_model(tmp_path, HOSTILE[kind]).model(model_digest(MODEL)) is None


@pytest.mark.parametrize("value", [-1, True, 1.5, "1", None])
def test_a_profile_with_an_ill_typed_thread_count_is_absent(tmp_path: Path, value: object
                                                             ) -> None:
    descriptions = _registry(tmp_path)
    path = tmp_path / "profiles" / f"{profile_digest(PROFILE).hex()}.json"
    path.write_text(json.dumps({**asdict(PROFILE), "num_threads": value}))
    assert descriptions.profile(profile_digest(PROFILE)) is None


@given(st.binary(max_size=512))
def test_any_bytes_read_as_absent_or_as_the_true_description(content: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        found = _overwrite_model(Path(folder), content).model(model_digest(MODEL))
    assert found in (None, MODEL)

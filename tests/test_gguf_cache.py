"""The model cache (``seqkv.models.gguf_cache``): a cached load is the GGUF's model bit for bit,
and a damaged, edited or unwritable cache costs time, never a different model or a failed load.

The GGUF conversion itself is the session's embedded model (``real_model``, converted with the
cache off): these tests stand a small file in for the GGUF (the cache keys on its bytes and
name) and count how often the conversion ran.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from seqkv.models import CausalLM, gguf_cache, loading
from seqkv.models.gguf_cache import cache_key, cache_root, load_through_cache

pytestmark = pytest.mark.real_model
TOKENS = [1, 504, 3458, 28, 957, 314, 29, 4401, 30, 2185, 1209]


class Conversions:
    """Stands in for the GGUF conversion: returns the session's model and counts the calls."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.calls = 0

    def __call__(self) -> CausalLM:
        self.calls += 1
        return self.model


@pytest.fixture(scope="module")
def written(real_model: CausalLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache root holding one folder, written from the session's model."""
    root = tmp_path_factory.mktemp("model-cache")
    gguf = root / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEQKV_MODEL_CACHE", str(root / "cache"))
        conversions = Conversions(real_model)
        assert load_through_cache(gguf, real_model.name, conversions) is real_model
        assert conversions.calls == 1
    yield root


@pytest.fixture
def cache(written: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of ``written`` for one test to damage; ``SEQKV_MODEL_CACHE`` points at it."""
    root = tmp_path / "root"
    shutil.copytree(written, root)
    monkeypatch.setenv("SEQKV_MODEL_CACHE", str(root / "cache"))
    return root


def _folder(root: Path) -> Path:
    return root / "cache" / cache_key(root / "model.gguf")


def _logits(model: CausalLM) -> torch.Tensor:
    with torch.inference_mode():
        logits: torch.Tensor = model.model(input_ids=torch.tensor([TOKENS])).logits
    return logits


def test_a_cached_load_is_the_gguf_model_bit_for_bit(cache: Path, real_model: CausalLM) -> None:
    conversions = Conversions(real_model)
    loaded = load_through_cache(cache / "model.gguf", real_model.name, conversions)
    assert conversions.calls == 0 and loaded is not real_model
    assert loaded.identity == real_model.identity
    assert torch.equal(_logits(loaded), _logits(real_model))  # every bit, every position
    text = "Restoring a session: naïve café, 你好, def f(x): return x ** 2\n"
    assert loaded.encode_text(text) == real_model.encode_text(text)
    assert loaded.decode_tokens(TOKENS) == real_model.decode_tokens(TOKENS)


def _changed_byte(path: Path, offset_from_end: int) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["one weight bit", "truncated weights", "config edited",
                                    "tokenizer probe", "manifest gone"])
def test_a_damaged_or_edited_folder_is_replaced_from_the_gguf(
        cache: Path, real_model: CausalLM, damage: str) -> None:
    folder = _folder(cache)
    if damage == "one weight bit":
        _changed_byte(folder / "model.safetensors", 1000)
    elif damage == "truncated weights":
        with (folder / "model.safetensors").open("r+b") as stream:
            stream.truncate(1 << 20)
    elif damage == "config edited":  # a config that still loads, and computes another function
        config = json.loads((folder / "config.json").read_text())
        config["rms_norm_eps"] = config["rms_norm_eps"] * 2
        (folder / "config.json").write_text(json.dumps(config))
    elif damage == "tokenizer probe":  # a tokenizer that splits text another way
        manifest = json.loads((folder / "seqkv-model.json").read_text())
        manifest["probe_ids"] = manifest["probe_ids"][1:]
        (folder / "seqkv-model.json").write_text(json.dumps(manifest))
    else:
        (folder / "seqkv-model.json").unlink()
    conversions = Conversions(real_model)
    assert load_through_cache(cache / "model.gguf", real_model.name, conversions) is real_model
    assert conversions.calls == 1
    # and the folder was written again, whole: the next load reads it
    again = Conversions(real_model)
    reloaded = load_through_cache(cache / "model.gguf", real_model.name, again)
    assert again.calls == 0 and reloaded.identity == real_model.identity


def test_another_gguf_file_name_or_library_version_gets_its_own_folder(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = cache / "model.gguf"
    key = cache_key(gguf)
    other = cache / "other.gguf"
    other.write_bytes(b"GGUF stand-In")
    assert cache_key(other) != key
    renamed = cache / "renamed.gguf"  # the same bytes: the config records the file's name
    renamed.write_bytes(gguf.read_bytes())
    assert cache_key(renamed) != key
    for library in ("gguf", "numpy", "kernels", "transformers", "seqkv"):
        monkeypatch.setattr(gguf_cache, "_version",
                            lambda name, changed=library: "9.9" if name == changed else "1")
        assert cache_key(gguf) not in {key, cache_key(renamed)}


def test_a_cache_that_fails_anywhere_never_fails_the_load(
        tmp_path: Path, real_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """No home folder (RuntimeError from Path.home), a cache folder that cannot be entered, a
    save that raises something else than OSError: the GGUF is loaded."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setenv("SEQKV_MODEL_CACHE", str(tmp_path / "cache"))

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    for name, failure in (("cache_root", no_home),
                          ("save_model", lambda *args, **kwargs: 1 / 0)):
        with monkeypatch.context() as patch:
            patch.setattr(gguf_cache, name, failure)
            conversions = Conversions(real_model)
            assert load_through_cache(gguf, real_model.name, conversions) is real_model
            assert conversions.calls == 1
    assert not (tmp_path / "cache" / cache_key(gguf)).exists()
    (tmp_path / "cache" / cache_key(gguf)).mkdir(parents=True)
    with monkeypatch.context() as patch:
        patch.setattr(Path, "is_dir", lambda self: (_ for _ in ()).throw(PermissionError(13, "x")))
        conversions = Conversions(real_model)
        assert load_through_cache(gguf, real_model.name, conversions) is real_model


def test_a_model_that_does_not_round_trip_is_not_cached_again(
        tmp_path: Path, real_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setenv("SEQKV_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_cache, "_read", lambda folder, name, expected=None: None)
    written: list[Path] = []
    real_write = gguf_cache._write
    monkeypatch.setattr(gguf_cache, "_write",
                        lambda folder, model: written.append(folder) or real_write(folder, model))
    for _ in range(2):
        assert load_through_cache(gguf, real_model.name, Conversions(real_model)) is real_model
    assert len(written) == 1  # written once, read back unequal, marked
    folder = tmp_path / "cache" / cache_key(gguf)
    assert not folder.exists() and folder.with_suffix(".uncacheable").exists()


def test_folders_take_the_umask_and_stale_partial_writes_go(
        tmp_path: Path, real_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import time

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    root = tmp_path / "cache"
    monkeypatch.setenv("SEQKV_MODEL_CACHE", str(root))
    stale, fresh = root / ".partial-killed", root / ".partial-running"
    for partial in (stale, fresh):
        partial.mkdir(parents=True)
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    previous = os.umask(0o022)
    try:
        load_through_cache(gguf, real_model.name, Conversions(real_model))
    finally:
        os.umask(previous)
    folder = root / cache_key(gguf)
    assert folder.stat().st_mode & 0o777 == 0o755
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert not stale.exists() and fresh.exists()


def test_turned_off_it_reads_and_writes_nothing(
        cache: Path, real_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQKV_MODEL_CACHE", "off")
    assert cache_root() is None
    conversions = Conversions(real_model)
    for _ in range(2):
        assert load_through_cache(cache / "model.gguf", real_model.name, conversions) is real_model
    assert conversions.calls == 2


def test_an_unwritable_cache_still_loads_the_model(
        tmp_path: Path, real_model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache's folder would go")
    monkeypatch.setenv("SEQKV_MODEL_CACHE", str(blocker / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    conversions = Conversions(real_model)
    for _ in range(2):
        assert load_through_cache(gguf, real_model.name, conversions) is real_model
    assert conversions.calls == 2


def test_gguf_files_load_through_the_cache(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    """``load_model(x.gguf)`` and the default model both go through ``load_through_cache``."""
    seen: list[Path] = []

    def through(file: Path, name: str, load: object, expected: str | None = None) -> str:
        seen.append(file)
        return "model"

    monkeypatch.setattr(loading, "load_through_cache", through)
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    assert loading.load_model(gguf) == "model"  # type: ignore[comparison-overlap]
    assert seen == [gguf]


def _forged_weights(folder: Path) -> str:
    """Issue 44's attack: one weight byte flipped in the cached safetensors and the manifest's
    weight digest recomputed to match, so the folder agrees with itself; the new digest."""
    _changed_byte(folder / "model.safetensors", 1000)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                 dtype=torch.float32)
    digest = CausalLM(model, None, "forged").identity.weights_sha256
    manifest = json.loads((folder / "seqkv-model.json").read_text())
    manifest["identity"]["weights"] = digest
    (folder / "seqkv-model.json").write_text(json.dumps(manifest))
    return digest


def test_the_embedded_models_cache_is_checked_against_the_shipped_digest(
        cache: Path, real_model: CausalLM) -> None:
    """A folder whose weights and manifest were changed together passes the folder's own check
    (invariant 5 says so for other models); given the digest the package ships, it is
    discarded and rebuilt from the GGUF, never loaded."""
    shipped = gguf_cache.shipped_weights_sha256()
    assert shipped == real_model.identity.weights_sha256  # real_model: the embedded model
    gguf = cache / "model.gguf"
    forged = _forged_weights(_folder(cache))
    assert forged != shipped
    unchecked = Conversions(real_model)
    assert load_through_cache(gguf, real_model.name, unchecked).identity.weights_sha256 == forged
    assert unchecked.calls == 0
    conversions = Conversions(real_model)
    assert load_through_cache(gguf, real_model.name, conversions, shipped) is real_model
    assert conversions.calls == 1
    again = Conversions(real_model)
    reloaded = load_through_cache(gguf, real_model.name, again, shipped)
    assert again.calls == 0 and reloaded.identity.weights_sha256 == shipped


def test_the_embedded_model_is_loaded_with_the_shipped_digest(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``load_default_model`` (and ``load_model`` of the same file) pass the shipped digest;
    another GGUF file passes none."""
    seen: list[str | None] = []

    def spy(file: Path, name: str, load: object, expected: str | None = None) -> CausalLM:
        seen.append(expected)
        return None  # type: ignore[return-value]

    monkeypatch.setattr(loading, "load_through_cache", spy)
    loading.load_default_model()
    loading.load_model(loading.default_model_file())
    (tmp_path / "other.gguf").write_bytes(b"GGUF stand-in")
    loading.load_model(tmp_path / "other.gguf")
    shipped = gguf_cache.shipped_weights_sha256()
    assert shipped is not None and seen == [shipped, shipped, None]

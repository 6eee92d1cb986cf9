"""Every ``SEQKV_*`` variable the package reads accepts only its values (issue 44): anything
else is one ``EnvironmentVariableError`` naming the variable and what it accepts, and one
``seqkv: error:`` line with exit status 2 from the CLI. (``SEQKV_INTEGER_*`` and
``SEQKV_NATIVE_DIR``: ``tests/test_integer_native.py``; ``SEQKV_KERNELS``:
``tests/test_kernels_dispatch.py``; ``SEQKV_TIMING_INJECT``: ``tests/test_timing_gate.py``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from seqkv import environment
from seqkv.bench import timing
from seqkv.cli import main
from seqkv.descriptions import default_root
from seqkv.errors import EnvironmentVariableError, SeqKVError
from seqkv.models import CausalLM, gguf_cache


@pytest.mark.parametrize("value", ["relative/cache", "of", "cache", "./x"])
def test_the_model_cache_takes_off_or_an_absolute_path(value: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQKV_MODEL_CACHE", value)
    with pytest.raises(EnvironmentVariableError,
                       match=r"^SEQKV_MODEL_CACHE='.*' is not accepted: set it to off or an "
                             r"absolute folder path, or unset it$"):
        gguf_cache.cache_root()


def test_the_model_cache_values_it_takes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for word in ("off", "OFF", "0", "no", "false", " off "):
        monkeypatch.setenv("SEQKV_MODEL_CACHE", word)
        assert gguf_cache.cache_root() is None
    monkeypatch.setenv("SEQKV_MODEL_CACHE", str(tmp_path))
    assert gguf_cache.cache_root() == tmp_path
    monkeypatch.setenv("SEQKV_MODEL_CACHE", "~/models")
    assert gguf_cache.cache_root() == Path.home() / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for unset in ("", "  "):
        monkeypatch.setenv("SEQKV_MODEL_CACHE", unset)
        assert gguf_cache.cache_root() == tmp_path / "seqkv" / "models"


def test_a_bad_model_cache_is_an_error_not_a_cache_passed_by(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The cache's failures are passed by (``gguf_cache`` invariant 3), a bad value is not."""
    monkeypatch.setenv("SEQKV_MODEL_CACHE", "relative")
    loads: list[int] = []

    def load_gguf() -> CausalLM:
        loads.append(1)
        raise AssertionError("not reached")

    with pytest.raises(EnvironmentVariableError, match="SEQKV_MODEL_CACHE"):
        gguf_cache.load_through_cache(tmp_path / "model.gguf", "model", load_gguf)
    assert loads == []


def test_seqkv_home_takes_an_absolute_path(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("SEQKV_HOME", "home")
    with pytest.raises(EnvironmentVariableError,
                       match=r"^SEQKV_HOME='home' is not accepted: set it to an absolute folder "
                             r"path, or unset it$"):
        default_root()
    monkeypatch.setenv("SEQKV_HOME", str(tmp_path))
    assert default_root() == tmp_path / "descriptions"
    monkeypatch.setenv("SEQKV_HOME", " ")
    assert default_root() == Path.home() / ".cache" / "seqkv" / "descriptions"


def test_the_timing_history_takes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(timing.HISTORY_ENV, "off")
    with pytest.raises(EnvironmentVariableError,
                       match=r"^SEQKV_TIMING_HISTORY='off' is not accepted: set it to none, or "
                             r"unset it$"):
        timing.run_gate(None)  # type: ignore[arg-type]  # refused before the model is used


def test_the_vllm_trace_takes_an_absolute_file_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQKV_VLLM_TRACE", "trace.jsonl")
    with pytest.raises(EnvironmentVariableError,
                       match=r"^SEQKV_VLLM_TRACE='trace.jsonl' is not accepted: set it to an "
                             r"absolute file path, or unset it$"):
        environment.path("SEQKV_VLLM_TRACE", "file")


def test_the_error_is_a_seqkv_error() -> None:
    assert issubclass(EnvironmentVariableError, SeqKVError)
    assert issubclass(EnvironmentVariableError, ValueError)


@pytest.mark.parametrize(("name", "value", "argv"), [
    ("SEQKV_MODEL_CACHE", "relative/cache", ["doctor"]),
    ("SEQKV_HOME", "home", ["compress", "TEXT", "-o", "OUT"]),
])
def test_the_cli_says_it_in_one_line(name: str, value: str, argv: list[str],
                                     use_tiny: CausalLM, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv(name, value)
    capsys.readouterr()
    (tmp_path / "text.txt").write_text("Hello there, a short text.")
    paths = {"OUT": str(tmp_path / "out.skv"), "TEXT": str(tmp_path / "text.txt")}
    assert main([paths.get(a, a) for a in argv]) == 2
    error = capsys.readouterr().err
    assert error == (f"seqkv: error: {name}={value!r} is not accepted: set it to "
                     f"{'off or ' if name == 'SEQKV_MODEL_CACHE' else ''}an absolute folder "
                     "path, or unset it\n")

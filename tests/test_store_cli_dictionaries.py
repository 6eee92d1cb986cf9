"""``seqkv store dict-put`` / ``dict-ls`` and ``put --level portable+mix``; the default level.

Directory and Redis stores, the tiny model with a whitespace tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqkv import cli
from seqkv.formats.span import read_frame
from seqkv.models import CausalLM
from seqkv.store import SessionStore, model_codecs
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.ids import SessionName, check_namespace, namespace_key


@pytest.fixture(params=["dir", "redis"])
def location(request: pytest.FixtureRequest, tmp_path: Path,
             redis_server: RedisServer) -> str:
    if request.param == "dir":
        return f"dir:{tmp_path / 'store'}"
    return redis_server.url  # each test uses namespaces of its own


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


DOCUMENT = " ".join(f"clause{i} binds party{i % 7} until year{i}" for i in range(12))


def test_dict_put_then_put_at_portable_mix(use_tiny: CausalLM, location: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    namespace = f"t-{tmp_path.name}"
    sample = tmp_path / "sample.txt"
    sample.write_text(DOCUMENT)
    dictionary = tmp_path / "ns.dict"
    status, out, _ = _run(capsys, "dict", "build", str(sample), "-o", str(dictionary),
                          "--namespace", namespace, "--json")
    assert status == 0
    digest = json.loads(out)["digest"]
    options = ["--store", location, "--namespace", namespace, "--json"]
    status, out, _ = _run(capsys, "store", "dict-put", str(dictionary), *options)
    assert status == 0 and json.loads(out)["digest"] == digest and json.loads(out)["created"]
    status, out, _ = _run(capsys, "store", "dict-ls", *options)
    assert json.loads(out) == {"current": digest, "dictionaries": [digest]}
    session = tmp_path / "session.txt"
    session.write_text("please read " + " ".join(DOCUMENT.split()[4:40]) + " thanks")
    sizes = {}
    for level, name in (("portable+mix", "mixed"), ("portable", "plain")):
        status, out, _ = _run(capsys, "store", "put", name, str(session), "--level", level,
                              "--kv", "none", "--store", location, "--namespace",
                              f"{namespace}-{name}" if level == "portable" else namespace,
                              "--json")
        assert status == 0
        sizes[level] = json.loads(out)["coded_bytes"]
    assert sizes["portable+mix"] < sizes["portable"]
    back = tmp_path / "back.txt"
    status, _, _ = _run(capsys, "store", "get", "mixed", "-o", str(back), *options)
    assert status == 0
    assert back.read_text() == " ".join(f"w{t}" for t in use_tiny.encode_text(
        session.read_text()))


def test_dict_put_refuses_another_namespaces_dictionary(
        use_tiny: CausalLM, location: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    sample = tmp_path / "sample.txt"
    sample.write_text(DOCUMENT)
    dictionary = tmp_path / "a.dict"
    assert cli.main(["dict", "build", str(sample), "-o", str(dictionary), "--namespace",
                     f"a-{tmp_path.name}"]) == 0
    capsys.readouterr()
    options = ["--store", location, "--namespace", f"b-{tmp_path.name}"]
    status, _, err = _run(capsys, "store", "dict-put", str(dictionary), *options)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "--namespace" in err
    session = tmp_path / "session.txt"
    session.write_text(DOCUMENT)
    status, _, err = _run(capsys, "store", "put", "s", str(session), "--level", "portable+mix",
                          "--kv", "none", *options)
    assert status == 2 and "holds no mixing dictionary" in err


def test_put_codes_at_portable_by_default(use_tiny: CausalLM, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "in.txt"
    text.write_text("the keeper lit the lamp at dusk " * 3)
    root = tmp_path / "store"
    status, _, _ = _run(capsys, "store", "put", "s", str(text), "--kv", "none",
                        "--store", f"dir:{root}", "--namespace", "n")
    assert status == 0
    store = SessionStore(DirectoryBackend(root), model_codecs(use_tiny))
    (found,) = store.backend.fetch_sessions(namespace_key(check_namespace("n")),
                                            [SessionName("s")])
    assert found is not None
    assert store.backend.codec(read_frame(found.chain[-1].record).codec).level == "portable"

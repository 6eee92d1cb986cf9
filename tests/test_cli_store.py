"""``seqkv store``: every verb on a directory store and on Redis, with the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqkv import cli
from seqkv.models import CausalLM
from seqkv.store.backends.redis_server import RedisServer


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(params=["dir", "redis"])
def location(request: pytest.FixtureRequest, tmp_path: Path,
             redis_server: RedisServer) -> str:
    if request.param == "dir":
        return f"dir:{tmp_path / 'store'}"
    # One database per test would need a server per test: use a namespace of its own instead.
    return redis_server.url


def test_put_get_ls_stat_gc(use_tiny: CausalLM, location: str, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    namespace = f"ns-{tmp_path.name}"
    text = tmp_path / "in.txt"
    text.write_text("the keeper lit the lamp at dusk " * 6)
    options = ["--store", location, "--namespace", namespace, "--json"]
    status, out, _ = _run(capsys, "store", "put", "chat-1", str(text), "--level", "ngram",
                          *options)
    assert status == 0 and json.loads(out)["tokens"] == 42
    back = tmp_path / "out.txt"
    status, out, _ = _run(capsys, "store", "get", "chat-1", "-o", str(back), *options)
    # the level rebuilds the KV with one prefill, the caller's own: bit for bit
    assert status == 0 and json.loads(out)["kv_exact"] is True
    assert back.read_text() == " ".join(f"w{t}" for t in use_tiny.encode_text(text.read_text()))
    status, out, _ = _run(capsys, "store", "ls", *options)
    assert json.loads(out) == ["chat-1"]
    status, out, _ = _run(capsys, "store", "stat", "chat-1", *options)
    assert json.loads(out)["tokens"] == 42
    status, _, _ = _run(capsys, "store", "gc", *options)
    assert status == 0


def test_put_many_and_get_many(use_tiny: CausalLM, location: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    namespace = f"many-{tmp_path.name}"
    sessions = tmp_path / "sessions.jsonl"
    lines = [{"id": f"s{i}", "text": "a shared system prompt " * 4 + f"question {i}",
              "namespace": namespace} for i in range(5)]
    sessions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    options = ["--store", location, "--json"]
    status, out, _ = _run(capsys, "store", "put-many", str(sessions), "--level", "plain",
                          *options)
    report = json.loads(out)
    assert status == 0 and report["sessions"] == 5 and report["shared_tokens"] > 0
    restored = tmp_path / "restored.jsonl"
    status, out, _ = _run(capsys, "store", "get-many", str(sessions), "-o", str(restored),
                          *options)
    rows = [json.loads(line) for line in restored.read_text().splitlines()]
    assert status == 0 and [row["id"] for row in rows] == [f"s{i}" for i in range(5)]
    assert all(row["kv_exact"] for row in rows)


def test_a_missing_session_and_a_bad_store_are_one_line_errors(
        use_tiny: CausalLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _run(capsys, "store", "get", "nobody", "-o", str(tmp_path / "x"),
                          "--store", f"dir:{tmp_path / 's'}")
    assert status == 2 and len(err.strip().splitlines()) == 1 and "nobody" in err
    status, _, err = _run(capsys, "store", "ls", "--store", "ftp://somewhere")
    assert status == 2 and "dir:PATH" in err

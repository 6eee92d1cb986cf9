"""Batch jobs: put-many / get-many from JSON lines, locally and through a local Ray instance."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqkv.models import CausalLM
from seqkv.store import SessionStore, model_codecs
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.errors import BatchInputError
from seqkv.store.fleet import StoreSpec
from seqkv.store.jobs import get_many_jsonl, put_many_jsonl, read_lines

SYSTEM = [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56]


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _sessions(count: int) -> list[dict[str, object]]:
    return [{"id": f"s{i}", "namespace": f"t{i % 2}",
             "tokens": [*SYSTEM, *range(100 + i, 108 + 2 * i)]} for i in range(count)]


def test_put_many_then_get_many(tiny_model: CausalLM, tmp_path: Path) -> None:
    rows = _sessions(6)
    store = SessionStore(DirectoryBackend(tmp_path / "store"), model_codecs(tiny_model))
    report = put_many_jsonl(store, _write(tmp_path / "in.jsonl", rows), level="ngram",
                            progress=None)
    assert report.sessions == 6
    assert report.shared_tokens == 4 * len(SYSTEM)  # the first of each namespace shares nothing
    wanted = _write(tmp_path / "ids.jsonl", [{"id": r["id"], "namespace": r["namespace"]}
                                             for r in rows])
    get_many_jsonl(store, wanted, tmp_path / "out.jsonl", batch_size=2,
                   detokenize=lambda t: " ".join(map(str, t)), progress=None)
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted((o["id"], o["tokens"]) for o in out) == sorted(
        (r["id"], r["tokens"]) for r in rows)
    assert all(o["text"] == " ".join(map(str, o["tokens"])) for o in out)


@pytest.mark.parametrize(("line", "problem"), [
    ('{"id": "a", "namespace": "n"}', "exactly one"),
    ('{"id": "a b", "namespace": "n", "tokens": [1]}', "not valid"),
    ('{"id": "a", "namespace": "n", "tokens": []}', "non-empty list"),
    ("[1, 2]", "JSON object"),
])
def test_bad_lines_are_refused_with_their_number(tmp_path: Path, line: str,
                                                 problem: str) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "ok", "namespace": "n", "tokens": [1, 2]}\n' + line + "\n")
    with pytest.raises(BatchInputError, match=f"line 2: .*{problem}"):
        read_lines(path)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray = pytest.importorskip("ray")  # the optional extra ray[data]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_ray_put_many_and_get_many(local_ray: None, tmp_path: Path) -> None:
    from seqkv.store.jobs import ray_get_many, ray_put_many

    rows = _sessions(8)
    spec = StoreSpec("directory", str(tmp_path / "store"), codec="portable", vocab_size=512)
    report = ray_put_many(spec, _write(tmp_path / "in.jsonl", rows), level="ngram",
                          actors=2, batch_size=2)
    assert report.sessions == 8
    wanted = _write(tmp_path / "ids.jsonl", [{"id": r["id"], "namespace": r["namespace"]}
                                             for r in rows])
    ray_get_many(spec, wanted, tmp_path / "out.jsonl", actors=2, batch_size=3)
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted((o["id"], o["tokens"]) for o in out) == sorted(
        (r["id"], r["tokens"]) for r in rows)
    store = spec.open()
    assert all(store.audit(namespace=n).consistent for n in ("t0", "t1"))

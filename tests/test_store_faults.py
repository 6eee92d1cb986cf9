"""Several writer processes on one store, writers killed mid-put, redis-server killed mid-run.

Every acknowledged put must decode exactly afterwards, reference counts must equal a recount,
and ``gc`` must leave no orphan. Workers run ``seqkv.store.fleet.put_worker`` with the tokens-only
codec, so the races and crashes exercise the index, the counts and the backends, not the model.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.fleet import PutJob, StoreSpec, put_worker, read_acks

VOCAB = 512
# NOTE: forked, not spawned: a spawned worker spends ~10 s importing torch on this 2-core machine,
# and these workers run no torch op (the tokens-only codec), so no thread pool crosses the fork.
_CONTEXT = multiprocessing.get_context("fork")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


def test_a_server_in_a_relative_directory_starts(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-server changes into its directory before opening its log: a relative directory
    (``python -m research.bench store``'s default workdir) must still start."""
    monkeypatch.chdir(tmp_path)
    with RedisServer(Path("relative") / "redis") as server:
        assert server.url.startswith("redis://127.0.0.1:")
    assert (tmp_path / "relative" / "redis" / "redis.log").exists()


def _spec(kind: str, tmp_path: Path, server: RedisServer | None) -> StoreSpec:
    if kind == "directory":
        return StoreSpec("directory", str(tmp_path / "store"), vocab_size=VOCAB)
    assert server is not None
    return StoreSpec("redis", server.url, prefix="faults", vocab_size=VOCAB)


def _jobs(worker: int, count: int, seed: int) -> list[PutJob]:
    """Sessions over three shared prefixes (system prompts) with short unique tails."""
    rng = random.Random(seed)
    prefixes = [[random.Random(p).randrange(3, VOCAB) for _ in range(40 + 25 * p)]
                for p in range(3)]
    jobs = []
    for index in range(count):
        tail = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(4, 24))]
        jobs.append(PutJob(f"w{worker}-{index}", "fleet", tuple(prefixes[index % 3] + tail),
                           "ngram"))
    return jobs


def _start(spec: StoreSpec, jobs: list[PutJob], acks: Path) -> multiprocessing.process.BaseProcess:
    process = _CONTEXT.Process(target=put_worker, args=(spec, jobs, str(acks)))
    process.start()
    return process


def _check(spec: StoreSpec, jobs: dict[str, PutJob], acked: list[str]) -> None:
    store = spec.open()
    names = sorted(set(acked))
    got = store.get_many(names, namespace="fleet")
    assert [list(s.tokens) for s in got] == [list(jobs[n].tokens) for n in names]
    audit = store.audit(namespace="fleet")
    assert audit.refcount_mismatches == 0 and audit.missing_records == 0
    store.gc(namespace="fleet")
    audit = store.audit(namespace="fleet")
    assert audit.consistent and audit.orphan_records == 0 and audit.dangling_index_entries == 0
    assert set(names) <= set(store.list(namespace="fleet"))
    store.close()


def _wait(process: multiprocessing.process.BaseProcess) -> None:
    process.join(timeout=300)
    assert process.exitcode == 0, process.exitcode


@pytest.mark.parametrize("kind", ["directory", "redis"])
def test_concurrent_writers_keep_refcounts_exact(kind: str, tmp_path: Path,
                                                 redis_server: RedisServer) -> None:
    spec = _spec(kind, tmp_path, redis_server)
    work = {w: _jobs(w, 30, w) for w in range(3)}
    processes = [_start(spec, jobs, tmp_path / f"acks{w}") for w, jobs in work.items()]
    for process in processes:
        _wait(process)
    jobs = {job.session: job for batch in work.values() for job in batch}
    acked = [a for w in work for a in read_acks(tmp_path / f"acks{w}")]
    assert sorted(acked) == sorted(jobs)
    _check(spec, jobs, acked)
    counts = spec.open().byte_counts(namespace="fleet")
    assert counts.spans < len(jobs) + 9  # prefixes are shared, not stored once per session


@pytest.mark.parametrize("kind", ["directory", "redis"])
def test_killed_writer_loses_no_acknowledged_put(kind: str, tmp_path: Path,
                                                 redis_server: RedisServer) -> None:
    spec = _spec(kind, tmp_path, redis_server)
    jobs = _jobs(0, 400, 7)
    process = _start(spec, jobs, tmp_path / "acks")
    deadline = time.monotonic() + 120
    while len(read_acks(tmp_path / "acks")) < 5 + random.Random(kind).randrange(20):
        assert time.monotonic() < deadline and process.is_alive()
        time.sleep(0.01)
    assert process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join()
    acked = read_acks(tmp_path / "acks")
    assert 0 < len(acked) < len(jobs)
    _check(spec, {job.session: job for job in jobs}, acked)


def test_redis_killed_and_restarted_keeps_every_acknowledged_put(
        tmp_path: Path, redis_server: RedisServer) -> None:
    spec = _spec("redis", tmp_path, redis_server)
    work = {w: _jobs(w, 200, 20 + w) for w in range(2)}
    processes = [_start(spec, jobs, tmp_path / f"acks{w}") for w, jobs in work.items()]
    deadline = time.monotonic() + 120
    while min(len(read_acks(tmp_path / f"acks{w}")) for w in work) < 5:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    before = sum(len(read_acks(tmp_path / f"acks{w}")) for w in work)
    redis_server.kill()
    time.sleep(0.3)
    redis_server.start()  # same port, same directory: the AOF is replayed
    for process in processes:
        _wait(process)
    jobs = {job.session: job for batch in work.values() for job in batch}
    acked = [a for w in work for a in read_acks(tmp_path / f"acks{w}")]
    assert before < len(acked) <= len(jobs)
    _check(spec, jobs, acked)


def test_directory_gc_removes_what_a_crash_leaves(tmp_path: Path) -> None:
    spec = _spec("directory", tmp_path, None)
    store = spec.open()
    job = _jobs(0, 1, 1)[0]
    store.put(job.session, list(job.tokens), level="ngram", namespace="fleet")
    folder = tmp_path / "store" / "records" / "07"
    folder.mkdir(exist_ok=True)
    (folder / "7").write_bytes(b"a record whose commit never happened")
    (folder / ".7.0123abcd.tmp").write_bytes(b"half a rec")
    assert store.audit(namespace="fleet").orphan_records == 2
    assert store.get(job.session, namespace="fleet").tokens == list(job.tokens)
    assert store.gc(namespace="fleet").orphan_records_removed == 2
    assert sorted(p.name for p in folder.iterdir()) == []
    assert store.audit(namespace="fleet").consistent

"""``run_store_bench``: the session store on a generated multi-tenant chat workload.

Five parts, each sized by ``StoreBenchConfig`` (tests run them tiny):

1. **Workload** coded with the embedded model at ``level`` (default ``ngram``: the model-coded
   levels code ~1 token per 55 ms here, too slow for hundreds of sessions): tenants with shared
   system prompts and documents cut from the shipped texts (``seqkv/data``), multi-turn sessions
   grown by ``append``, documents of 4,000+ tokens. Measured: the store's bytes (records, index,
   session table, counts) against the coded payloads, fp16 KV, zstd -19 of the texts and one
   ``.skv`` per session; the prefix hit rate; put and get speed with the model.
2. **Index scale**: ``scale_sessions`` sessions with the tokens-only ``plain`` codec (no model
   forwards) on Redis; at checkpoints, round trips and latency of a prefix lookup, Redis memory
   and the logical bytes as the store grows.
3. **Throughput**: put and get with 1 and 2 worker processes, directory against Redis (tokens-only
   codec, so the store and not the model is measured).
4. **Faults**: writers killed with SIGKILL mid-run and restarted, redis-server killed with SIGKILL
   and restarted on its AOF; acknowledged sessions lost and corrupt counts (targets: 0 and 0).

What the byte target counts: ``store_bytes`` = span records (frame + codec payload) + index
entries (key + span id) + session entries without the ids + reference counts; the session ids
are reported apart. ``coded_bytes`` = the coded tokens and residual of every stored span. Target:
``store_bytes <= 1.05 * coded_bytes + 24 * sessions``.

Nothing here mutates anything outside ``workdir`` and the Redis servers it starts and stops.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import multiprocessing
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from seqkv.digests import DIGEST_BYTES, Digest
from seqkv.formats.skv import write_skv
from seqkv.models.adapter import CausalLM
from seqkv.progress import Progress, ProgressSink, tracked
from seqkv.store.backends.redis import RedisBackend
from seqkv.store.backends.redis_server import RedisServer
from seqkv.store.codecs import TokensCodec
from seqkv.store.fleet import PutJob, StoreSpec, put_worker, read_acks
from seqkv.store.registry import model_codecs
from seqkv.store.store import SessionStore

# NOTE: 6 GiB of decoded KV per store object: ~60 chains through a 4,300-token document
# (23,040 float32 bytes per SmolLM2 token); the machine has 24 GiB.
_HOT_BYTES = 6 << 30


@dataclass(frozen=True)
class StoreBenchConfig:
    sessions: int = 200
    tenants: int = 4
    level: str = "ngram"
    doc_probability: float = 0.35
    long_document_words: int = 3200  # ~4,300 tokens with SmolLM2's tokenizer
    short_document_words: int = 500
    max_turns: int = 3  # appends after the first message
    get_sample: int = 24  # sessions decoded cold to time gets
    scale_sessions: int = 100_000
    scale_checkpoints: int = 5
    scale_probes: int = 200
    throughput_sessions: int = 2_000
    fault_sessions: int = 300
    seed: int = 0
    # "spawn" for real runs; tests may "fork" (the workers run the tokens-only codec, no torch).
    start_method: Literal["spawn", "fork"] = "spawn"


@dataclass(frozen=True)
class Distribution:
    count: int
    minimum: int
    median: float
    p90: float
    maximum: int
    total: int

    @classmethod
    def of(cls, values: Sequence[int]) -> Distribution:
        ordered = sorted(values) or [0]
        return cls(len(values), ordered[0], float(statistics.median(ordered)),
                   float(ordered[int(0.9 * (len(ordered) - 1))]), ordered[-1], sum(values))


@dataclass(frozen=True)
class WorkloadFigures:
    sessions: int
    tenants: int
    level: str
    session_tokens: Distribution
    turns: Distribution  # messages per session (the first put + appends)
    sessions_with_document: int
    sessions_over_4000_tokens: int
    description: str


@dataclass(frozen=True)
class ByteFigures:
    sessions: int
    spans: int
    records: int
    record_frames: int  # record bytes that are not coded tokens or residual
    index: int
    index_entries: int
    session_entries: int  # without the ids
    session_ids: int
    refcounts: int
    store_bytes: int  # records + index + session entries + refcounts
    coded_bytes: int
    target_bytes: float  # 1.05 * coded + 24 * sessions
    overhead_per_session: float  # (store_bytes - coded_bytes) / sessions
    backend_bytes: int | None  # Redis MEMORY USAGE of the keys, or bytes on disk


@dataclass(frozen=True)
class Comparison:
    fp16_kv_bytes: int
    zstd19_per_session_bytes: int | None  # None: zstandard not installed
    zstd19_corpus_bytes: int | None
    skv_per_session_bytes: int | None  # one .skv per session, no sharing (portable levels only)
    text_bytes: int


@dataclass(frozen=True)
class ModelRun:
    put_tokens_per_second: float  # session tokens (shared included) over put + append time
    coded_tokens_per_second: float
    get_sessions: int
    get_tokens_per_second: float
    prefix_hit_rate: float  # tokens found stored / tokens of first messages
    coded_fraction: float  # tokens coded / session tokens
    all_gets_exact: bool


@dataclass(frozen=True)
class ScalePoint:
    sessions: int
    lookup_round_trips: float  # mean over probes
    lookup_candidates: float
    lookup_ms_median: float
    lookup_ms_p90: float
    put_ms_mean: float  # over the puts since the last point
    redis_used_memory: int
    logical_bytes: int  # records + index + session table + counts
    index_bytes: int
    index_entries: int


@dataclass(frozen=True)
class Throughput:
    backend: str
    workers: int
    sessions: int
    put_sessions_per_second: float
    get_sessions_per_second: float


@dataclass(frozen=True)
class FaultRun:
    backend: str
    acknowledged: int
    lost: int  # acknowledged sessions that do not decode exactly
    refcount_mismatches: int
    orphans_after_gc: int
    writer_kills: int
    server_kills: int


@dataclass(frozen=True)
class StoreBenchResult:
    config: StoreBenchConfig
    model: str
    machine: str
    workload: WorkloadFigures | None
    bytes: ByteFigures | None
    comparison: Comparison | None
    model_run: ModelRun | None
    scale: tuple[ScalePoint, ...]
    throughput: tuple[Throughput, ...]
    faults: tuple[FaultRun, ...]
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def _texts() -> list[str]:
    root = importlib.resources.files("seqkv") / "data"
    texts = [(root / "sample.txt").read_text("utf-8")]
    texts += [(root / "kinds" / name).read_text("utf-8")
              for name in ("code.txt", "legal.txt", "technical.txt")]
    return texts


def _hash_tokenizer(vocab: int) -> Callable[[str], list[int]]:
    """For models without a tokenizer: one id per word, from a hash of the word."""
    def tokenize(text: str) -> list[int]:
        return [2 + int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little")
                % (vocab - 2) for w in text.split()]
    return tokenize


@dataclass(frozen=True)
class _Session:
    name: str
    namespace: str
    pieces: tuple[str, ...]  # system prompt, document?, first user message
    turns: tuple[str, ...]  # later messages, each appended
    has_document: bool


def _workload(config: StoreBenchConfig) -> list[_Session]:
    rng = random.Random(config.seed)
    texts = _texts()
    words = [w for t in texts for w in t.split()]
    tenants = [f"tenant-{t}" for t in range(config.tenants)]
    prompts: dict[str, list[str]] = {}
    documents: dict[str, list[str]] = {}
    for index, tenant in enumerate(tenants):
        prompts[tenant] = []
        for p in range(2):
            start = rng.randrange(len(words) - 300)
            body = " ".join(words[start : start + rng.randrange(60, 250)])
            prompts[tenant].append(f"You are assistant {index}.{p} of {tenant}. {body}")
        documents[tenant] = []
        for size in (config.long_document_words, config.short_document_words):
            rotated = texts[index % 4 :] + texts[: index % 4]
            body = " ".join(" ".join(rotated).split() * (1 + size // len(words)))
            documents[tenant].append(" ".join(body.split()[:size]))
    weights = [1 / (1 + t) for t in range(config.tenants)]
    sessions = []
    for number in range(config.sessions):
        tenant = rng.choices(tenants, weights)[0]
        pieces = [rng.choice(prompts[tenant])]
        has_document = rng.random() < config.doc_probability
        if has_document:
            pieces.append(rng.choice(documents[tenant]))
        pieces.append("User: " + " ".join(rng.sample(words, rng.randrange(15, 60))))
        turns = tuple(("Assistant: " if t % 2 == 0 else "User: ")
                      + " ".join(rng.sample(words, rng.randrange(10, 50)))
                      for t in range(rng.randrange(0, config.max_turns + 1)))
        sessions.append(_Session(f"chat-{number}", tenant, tuple(pieces), turns, has_document))
    return sessions


def _skv_bytes(model: CausalLM, level: str, tokens: list[int]) -> int:
    """The bytes of one ``.skv`` file of ``tokens`` at a model-free ``level`` with its KV digest
    (as ``compress`` writes it), without computing the KV: the digests' values do not change
    the file's size."""
    session = TokensCodec(model.vocab_size, level).encode(tokens, None, None, None).session
    digest = Digest(bytes(DIGEST_BYTES))
    return len(write_skv(replace(session, kv_scope="all", kv_digest=digest)).data)


def _zstd(data: bytes) -> int | None:
    try:
        import zstandard
    except ImportError:
        return None
    return len(zstandard.ZstdCompressor(level=19).compress(data))


def _model_run(model: CausalLM, config: StoreBenchConfig, url: str,
               progress: ProgressSink | None
               ) -> tuple[WorkloadFigures, ByteFigures, Comparison, ModelRun]:
    tokenize = model.encode_text if model.tokenizer is not None else _hash_tokenizer(
        model.vocab_size)
    sessions = _workload(config)
    store = SessionStore(RedisBackend(url, "model"), model_codecs(model), hot_bytes=_HOT_BYTES)
    lengths, turns, coded, first_tokens, shared, frames = [], [], 0, 0, 0, 0
    coded_tokens = 0
    token_lists: dict[str, list[int]] = {}
    texts: list[bytes] = []
    started = time.perf_counter()
    for session in tracked(sessions, progress, "model workload", "session", len(sessions)):
        tokens = [t for piece in session.pieces for t in tokenize(piece)]
        result = store.put(session.name, tokens, level=config.level,
                           namespace=session.namespace)
        first_tokens += len(tokens)
        shared += result.shared_tokens
        results = [result]
        for turn in session.turns:
            added = tokenize(turn)
            results.append(store.append(session.name, added, namespace=session.namespace))
            tokens += added
        for r in results:
            if r.record_bytes:
                coded += r.coded_bytes
                frames += r.record_bytes - r.coded_bytes
                coded_tokens += r.coded_tokens
        lengths.append(len(tokens))
        turns.append(1 + len(session.turns))
        token_lists[session.name] = tokens
        texts.append("\n".join(session.pieces + session.turns).encode())
    put_seconds = time.perf_counter() - started
    namespaces = sorted({s.namespace for s in sessions})
    counts = [store.byte_counts(namespace=n) for n in namespaces]
    records = sum(c.records for c in counts)
    index = sum(c.index for c in counts)
    entries = sum(c.sessions - c.session_ids for c in counts)
    ids = sum(c.session_ids for c in counts)
    refcounts = sum(c.refcounts for c in counts)
    store_bytes = records + index + entries + refcounts
    n = len(sessions)
    bytes_figures = ByteFigures(
        sessions=n, spans=sum(c.spans for c in counts), records=records,
        record_frames=records - coded, index=index,
        index_entries=sum(c.index_entries for c in counts), session_entries=entries,
        session_ids=ids, refcounts=refcounts, store_bytes=store_bytes, coded_bytes=coded,
        target_bytes=1.05 * coded + 24 * n, overhead_per_session=(store_bytes - coded) / n,
        backend_bytes=sum(c.backend_bytes or 0 for c in counts))
    # Cold gets: a fresh store object (empty hot tier) on the same Redis, in batches of 8.
    sample = sessions[: config.get_sample]
    cold = SessionStore(RedisBackend(url, "model"), model_codecs(model), hot_bytes=_HOT_BYTES)
    exact = True
    got_tokens = 0
    started = time.perf_counter()
    for namespace in namespaces:
        names = [s.name for s in sample if s.namespace == namespace]
        for begin in range(0, len(names), 8):
            for got in cold.get_many(names[begin : begin + 8], namespace=namespace):
                exact &= got.tokens == token_lists[got.session]
                got_tokens += len(got.tokens)
    get_seconds = time.perf_counter() - started
    skv_bytes = None
    if config.level in ("ngram", "plain"):
        skv_bytes = sum(_skv_bytes(model, config.level, t) for t in token_lists.values())
    corpus = b"\n".join(texts)
    zstd_each = [_zstd(t) for t in texts]
    comparison = Comparison(
        fp16_kv_bytes=sum(lengths) * model.kv_components_per_token * 2,
        zstd19_per_session_bytes=None if None in zstd_each else sum(z or 0 for z in zstd_each),
        zstd19_corpus_bytes=_zstd(corpus), skv_per_session_bytes=skv_bytes,
        text_bytes=len(corpus))
    with_document = sum(1 for s in sessions if s.has_document)
    workload = WorkloadFigures(
        sessions=n, tenants=config.tenants, level=config.level,
        session_tokens=Distribution.of(lengths), turns=Distribution.of(turns),
        sessions_with_document=with_document,
        sessions_over_4000_tokens=sum(1 for x in lengths if x >= 4000),
        description="per session: one of the tenant's 2 system prompts (60-250 words of the "
        f"shipped texts), with probability {config.doc_probability} one of the tenant's 2 "
        f"documents ({config.long_document_words} or {config.short_document_words} words of "
        "the shipped texts, rotated per tenant), a first user message of 15-60 words drawn "
        f"from the texts, then 0-{config.max_turns} appended turns of 10-50 words; tenants "
        "drawn with weights 1/(1+t); pieces tokenized separately and concatenated")
    run = ModelRun(put_tokens_per_second=sum(lengths) / put_seconds,
                   coded_tokens_per_second=coded_tokens / put_seconds, get_sessions=len(sample),
                   get_tokens_per_second=got_tokens / get_seconds if get_seconds else 0.0,
                   prefix_hit_rate=shared / first_tokens,
                   coded_fraction=coded_tokens / sum(lengths), all_gets_exact=exact)
    store.close()
    cold.close()
    return workload, bytes_figures, comparison, run


def _scale_jobs(config: StoreBenchConfig, vocab: int, count: int, salt: int
                ) -> list[tuple[str, list[int]]]:
    shared = random.Random(config.seed)  # prompts and documents: the same for every salt
    prompts = {t: [[shared.randrange(vocab) for _ in range(shared.randrange(64, 512))]
                   for _ in range(8)] for t in range(config.tenants)}
    documents = {t: [[shared.randrange(vocab) for _ in range(1024)] for _ in range(16)]
                 for t in range(config.tenants)}
    rng = random.Random(config.seed + salt)
    jobs = []
    for number in range(count):
        tenant = number % config.tenants
        tokens = list(rng.choice(prompts[tenant]))
        if rng.random() < 0.2:
            tokens += rng.choice(documents[tenant])
        tokens += [rng.randrange(vocab) for _ in range(rng.randrange(16, 96))]
        jobs.append((f"tenant-{tenant}", tokens))
    return jobs


def _scale_run(config: StoreBenchConfig, vocab: int, url: str,
               progress: ProgressSink | None
               ) -> tuple[ScalePoint, ...]:
    def codecs(level: str) -> TokensCodec:
        return TokensCodec(vocab, level)

    backend = RedisBackend(url, "scale")
    store = SessionStore(backend, codecs)
    jobs = _scale_jobs(config, vocab, config.scale_sessions, 1)
    probes = _scale_jobs(config, vocab, config.scale_probes, 2)
    step = max(1, config.scale_sessions // config.scale_checkpoints)
    points = []
    done = 0
    while done < len(jobs):
        started = time.perf_counter()
        batch = jobs[done : done + step]
        for offset, (namespace, tokens) in enumerate(batch):
            store.put(f"s{done + offset}", tokens, level="plain", namespace=namespace)
        put_ms = 1000 * (time.perf_counter() - started) / len(batch)
        done += len(batch)
        if progress is not None:
            progress(Progress("index scale", done, len(jobs), "session"))
        prober = SessionStore(RedisBackend(url, "scale"), codecs)  # cold hot tier
        times, trips, candidates = [], [], []
        for namespace, tokens in probes:
            begun = time.perf_counter()
            match = prober.find_prefix(tokens, level="plain", namespace=namespace)
            times.append(1000 * (time.perf_counter() - begun))
            trips.append(match.round_trips)
            candidates.append(match.candidates)
        prober.close()
        counts = [store.byte_counts(namespace=f"tenant-{t}") for t in range(config.tenants)]
        memory = int(backend.client.info("memory")["used_memory"])
        times.sort()
        points.append(ScalePoint(
            sessions=done, lookup_round_trips=statistics.fmean(trips),
            lookup_candidates=statistics.fmean(candidates),
            lookup_ms_median=float(statistics.median(times)),
            lookup_ms_p90=times[int(0.9 * (len(times) - 1))], put_ms_mean=put_ms,
            redis_used_memory=memory,
            logical_bytes=sum(c.records + c.index + c.sessions + c.refcounts for c in counts),
            index_bytes=sum(c.index for c in counts),
            index_entries=sum(c.index_entries for c in counts)))
    store.close()
    return tuple(points)


def _context(method: str) -> Any:
    """A multiprocessing context (typed ``Any``: its ``Process`` differs per start method)."""
    return multiprocessing.get_context("fork" if method == "fork" else "spawn")


def _throughput_worker(spec: StoreSpec, jobs: Sequence[PutJob], barrier: Any,
                       results: Any) -> None:
    store = spec.open()
    store.put("warm-" + jobs[0].session, [1, 2, 3], level="plain", namespace="warm")
    barrier.wait()
    started = time.perf_counter()
    for job in jobs:
        store.put(job.session, list(job.tokens), level=job.level, namespace=job.namespace)
    put_seconds = time.perf_counter() - started
    barrier.wait()
    reader = spec.open()
    started = time.perf_counter()
    names = [job.session for job in jobs]
    for begin in range(0, len(names), 16):
        reader.get_many(names[begin : begin + 16], namespace=jobs[0].namespace)
    results.put((put_seconds, time.perf_counter() - started))


def _throughput(config: StoreBenchConfig, vocab: int, url: str, workdir: Path
                ) -> tuple[Throughput, ...]:
    out = []
    jobs = [PutJob(f"s{i}", "t", tuple(tokens), "plain") for i, (_, tokens) in enumerate(
        _scale_jobs(config, vocab, config.throughput_sessions, 3))]
    for kind in ("directory", "redis"):
        for workers in (1, 2):
            tag = f"tp-{kind}-{workers}"
            spec = (StoreSpec("directory", str(workdir / tag), vocab_size=vocab)
                    if kind == "directory" else StoreSpec("redis", url, tag, vocab_size=vocab))
            context = _context(config.start_method)
            barrier = context.Barrier(workers)
            results = context.Queue()
            shares = [jobs[w::workers] for w in range(workers)]
            processes = [context.Process(target=_throughput_worker,
                                        args=(spec, share, barrier, results))
                         for share in shares]
            for process in processes:
                process.start()
            timings = [results.get(timeout=1800) for _ in processes]
            for process in processes:
                process.join()
            put = max(t[0] for t in timings)
            get = max(t[1] for t in timings)
            out.append(Throughput(kind, workers, len(jobs), len(jobs) / put, len(jobs) / get))
    return tuple(out)


def _fault_run(config: StoreBenchConfig, vocab: int, kind: str, workdir: Path,
               server: RedisServer | None) -> FaultRun:
    spec = (StoreSpec("directory", str(workdir / "faults"), vocab_size=vocab) if server is None
            else StoreSpec("redis", server.url, "faults", vocab_size=vocab))
    all_jobs = [PutJob(f"w{w}-s{i}", "t", tuple(tokens), "plain")
                for w in range(2) for i, (_, tokens) in enumerate(
                    _scale_jobs(config, vocab, config.fault_sessions, 10 + w))]
    per_worker = {w: [j for j in all_jobs if j.session.startswith(f"w{w}-")] for w in range(2)}
    acks = {w: workdir / f"acks-{kind}-{w}" for w in range(2)}
    for path in acks.values():
        path.unlink(missing_ok=True)

    def start(worker: int) -> Any:
        done = set(read_acks(acks[worker]))
        remaining = [j for j in per_worker[worker] if j.session not in done]
        process = _context(config.start_method).Process(
            target=put_worker,
            args=(spec, remaining, str(acks[worker]), 120.0, True))
        process.start()
        return process

    def wait_acks(worker: int, count: int) -> None:
        deadline = time.monotonic() + 600
        while len(read_acks(acks[worker])) < count and time.monotonic() < deadline:
            time.sleep(0.02)

    processes = {w: start(w) for w in range(2)}
    writer_kills = server_kills = 0
    quarter = config.fault_sessions // 4
    wait_acks(0, quarter)
    os.kill(processes[0].pid, signal.SIGKILL)
    processes[0].join()
    writer_kills += 1
    processes[0] = start(0)
    if server is not None:
        wait_acks(1, 2 * quarter)
        server.kill()
        server_kills += 1
        time.sleep(0.5)
        server.start()
    wait_acks(1, 3 * quarter)
    os.kill(processes[1].pid, signal.SIGKILL)
    processes[1].join()
    writer_kills += 1
    processes[1] = start(1)
    for process in processes.values():
        process.join(timeout=1800)
    store = spec.open()
    acked = sorted({a for w in range(2) for a in read_acks(acks[w])})
    wanted = {j.session: list(j.tokens) for j in all_jobs}
    lost = 0
    for begin in range(0, len(acked), 64):
        names = acked[begin : begin + 64]
        try:
            got = store.get_many(names, namespace="t")
            lost += sum(1 for g in got if g.tokens != wanted[g.session])
        except Exception:
            for name in names:
                try:
                    lost += store.get(name, namespace="t").tokens != wanted[name]
                except Exception:
                    lost += 1
    audit = store.audit(namespace="t")
    store.gc(namespace="t")
    after = store.audit(namespace="t")
    store.close()
    return FaultRun(kind, len(acked), lost, audit.refcount_mismatches, after.orphan_records,
                    writer_kills, server_kills)


def run_store_bench(model: CausalLM, config: StoreBenchConfig | None = None, *,
                    workdir: str | os.PathLike[str], progress: ProgressSink | None = None,
                    parts: Sequence[str] = ("model", "scale", "throughput", "faults"),
                    ) -> StoreBenchResult:
    """Run the chosen parts in ``workdir`` (Redis servers are started there and stopped)."""
    config = config or StoreBenchConfig()
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    workload = byte_figures = comparison = model_run = None
    scale: tuple[ScalePoint, ...] = ()
    throughput: tuple[Throughput, ...] = ()
    faults: list[FaultRun] = []
    with RedisServer(root / "redis") as server:
        if "model" in parts:
            begun = time.perf_counter()
            workload, byte_figures, comparison, model_run = _model_run(model, config,
                                                                       server.url, progress)
            seconds["model"] = time.perf_counter() - begun
        if "scale" in parts:
            begun = time.perf_counter()
            scale = _scale_run(config, model.vocab_size, server.url, progress)
            seconds["scale"] = time.perf_counter() - begun
        if "throughput" in parts:
            begun = time.perf_counter()
            throughput = _throughput(config, model.vocab_size, server.url, root)
            seconds["throughput"] = time.perf_counter() - begun
    if "faults" in parts:
        begun = time.perf_counter()
        faults.append(_fault_run(config, model.vocab_size, "directory", root, None))
        with RedisServer(root / "redis-faults") as fault_server:
            faults.append(_fault_run(config, model.vocab_size, "redis", root, fault_server))
        seconds["faults"] = time.perf_counter() - begun
    machine = (f"{os.cpu_count()} CPUs (shared with other jobs), "
               f"{os.uname().sysname} {os.uname().machine}")
    return StoreBenchResult(config, model.name, machine, workload, byte_figures, comparison,
                            model_run, scale, throughput, tuple(faults), seconds)


def main() -> None:
    """``python -m research.bench.store [--tiny] [--json FILE] [--parts model,scale,...]``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--tiny", action="store_true", help="the tiny random model, tiny sizes")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--parts", default="model,scale,throughput,faults")
    parser.add_argument("--workdir", type=Path, default=Path("store-bench"))
    parser.add_argument("--sessions", type=int)
    parser.add_argument("--scale-sessions", type=int)
    args = parser.parse_args()
    if args.tiny:
        from seqkv.models import tiny_random_llama

        model = tiny_random_llama()
        config = StoreBenchConfig(sessions=12, long_document_words=300, short_document_words=80,
                                  get_sample=6, scale_sessions=400, scale_checkpoints=2,
                                  scale_probes=20, throughput_sessions=60, fault_sessions=60)
    else:
        from seqkv.models import load_default_model

        model = load_default_model()
        config = StoreBenchConfig()
    overrides: dict[str, int] = {}
    if args.sessions:
        overrides["sessions"] = args.sessions
    if args.scale_sessions:
        overrides["scale_sessions"] = args.scale_sessions
    if overrides:
        config = StoreBenchConfig(**{**asdict(config), **overrides})
    result = run_store_bench(model, config, workdir=args.workdir, progress=_print_progress,
                             parts=args.parts.split(","))
    text = json.dumps(result.to_json_dict(), indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


def _print_progress(event: Progress) -> None:
    print(f"{event.task}: {event.done}/{event.total}", file=sys.stderr)


if __name__ == "__main__":
    main()

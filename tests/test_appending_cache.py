"""``AppendingCache``: the same keys, values and forward bits as ``DynamicCache``, without
copying the cache at every step; no tensor it handed out changes afterwards."""

from __future__ import annotations

import importlib.resources

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from seqkv import kvcache
from seqkv.kvcache import AppendingCache, AppendingLayer, cache_from_tensor
from seqkv.models import CausalLM
from seqkv.models.adapter import Stepper
from seqkv.schedule import pinned_threads

# (positions to append, or -positions to crop)
_operations = st.lists(st.integers(min_value=-3, max_value=5).filter(bool), min_size=1,
                       max_size=30)


@settings(max_examples=60, deadline=None)
@given(operations=_operations, min_headroom=st.integers(0, 4), seed=st.integers(0, 2**16))
def test_appends_and_crops_hold_what_a_dynamic_layer_holds(operations: list[int],
                                                           min_headroom: int,
                                                           seed: int) -> None:
    """Every update returns the keys and values ``DynamicLayer`` returns, across moves to new
    buffers (small headroom: many of them) and crops; every tensor returned earlier keeps the
    numbers it had when it was returned."""
    generator = torch.Generator().manual_seed(seed)
    appending, dynamic = AppendingLayer(min_headroom=min_headroom, headroom=0.25), DynamicLayer()
    returned: list[tuple[torch.Tensor, torch.Tensor]] = []
    for count in operations:
        if count < 0:
            if dynamic.get_seq_length() > -count:
                appending.crop(count)
                dynamic.crop(count)
            continue
        keys, values = (torch.randn(1, 2, count, 4, generator=generator) for _ in range(2))
        got = appending.update(keys, values)
        want = dynamic.update(keys.clone(), values.clone())
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert torch.equal(appending.keys, dynamic.keys)
        assert torch.equal(appending.values, dynamic.values)
        returned.append((got[0], got[0].clone()))
        returned.append((got[1], got[1].clone()))
    assert all(torch.equal(view, snapshot) for view, snapshot in returned)


def test_a_stepper_appends_in_place(tiny_model: CausalLM) -> None:
    """After its first step a stepper's cache grows into room it already has: the keys of one
    step and the next share storage (``DynamicCache`` would copy the whole cache each step)."""
    stepper = tiny_model.new_stepper()
    stepper.step(1)
    stepper.step(2)
    before = stepper.cache.layers[0].keys
    stepper.step(3)
    after = stepper.cache.layers[0].keys
    assert after.shape[-2] == before.shape[-2] + 1
    assert after.data_ptr() == before.data_ptr()


@pytest.mark.real_model
def test_token_steps_give_the_bits_of_a_dynamic_cache(real_model: CausalLM,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``tokens`` level's schedule on the appending cache: every step's logits and the final
    KV are those of ``DynamicCache`` bit for bit, from an empty cache and from a stored prefix,
    with room for 3 positions at a time (a new buffer every few steps)."""
    monkeypatch.setattr(kvcache, "MIN_HEADROOM", 3)
    monkeypatch.setattr(kvcache, "HEADROOM", 0.05)
    text = (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8")
    tokens = real_model.encode_text(text)[:96]
    prefix_kv = real_model.kv_tensor(real_model.prefill(tokens[:64]))
    starts: list[tuple[Stepper, Stepper, list[int]]] = [
        (real_model.new_stepper(), Stepper(real_model.model, DynamicCache()), tokens[:24]),
        (real_model.new_stepper(prefix_kv),
         Stepper(real_model.model, cache_from_tensor(prefix_kv)), tokens[64:]),
    ]
    for appending, dynamic, steps in starts:
        assert isinstance(appending.cache, AppendingCache)
        with pinned_threads():
            for token in steps:
                assert torch.equal(torch.from_numpy(appending.step(token)),
                                   torch.from_numpy(dynamic.step(token)))
        assert torch.equal(real_model.kv_tensor(appending.cache),
                           real_model.kv_tensor(dynamic.cache))

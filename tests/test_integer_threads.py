"""The integer decode's thread policy (``seqkv.models.integer.threads``): it runs the faster
count, keeps trying the other, follows a change of load, and never changes a decoded token."""

from __future__ import annotations

import pytest

from seqkv.codec import compress, decompress_tokens
from seqkv.errors import InvalidConfigError
from seqkv.models import CausalLM
from seqkv.models.integer.threads import THREADS_ENV, ThreadPolicy, decode_policy


def _run(policy: ThreadPolicy, step_seconds: dict[int, float], steps: int) -> list[int]:
    chosen = []
    for _ in range(steps):
        threads = policy.choose()
        chosen.append(threads)
        policy.record(threads, step_seconds[threads])
    return chosen


def test_each_count_is_measured_then_the_faster_runs_and_the_other_is_retried() -> None:
    policy = ThreadPolicy((2, 1), explore_every=8)
    chosen = _run(policy, {2: 0.030, 1: 0.018}, 64)  # two threads slow: a core is busy
    assert chosen[:2] == [2, 1]
    assert policy.best() == 1
    later = chosen[2:]
    assert later.count(2) == sum(1 for step in range(3, 65) if step % 8 == 0)  # the retries
    assert later.count(1) == len(later) - later.count(2)


def test_the_policy_follows_the_load_when_it_changes() -> None:
    policy = ThreadPolicy((2, 1), explore_every=4)
    _run(policy, {2: 0.030, 1: 0.018}, 40)
    assert policy.best() == 1
    chosen = _run(policy, {2: 0.011, 1: 0.018}, 40)  # the competing process ended
    assert policy.best() == 2 and chosen[-20:].count(2) == 15  # 1 retried every 4th


def test_the_environment_fixes_the_count_or_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_ENV, "3")
    assert decode_policy(native=True).counts == (3,)
    for bad in ("0", "-1", "two", "²"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(InvalidConfigError, match=THREADS_ENV):
            decode_policy(native=True)
    monkeypatch.delenv(THREADS_ENV)
    assert decode_policy(native=False).counts == (1,)
    assert 1 in decode_policy(native=True).counts
    with pytest.raises(InvalidConfigError):
        ThreadPolicy(())


@pytest.mark.parametrize("setting", ["1", "2", "adaptive"])
def test_the_decoded_tokens_do_not_depend_on_the_policy(
        tiny_model: CausalLM, monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    tokens = [int(t) for t in range(3, 200, 7)] + [5, 6, 7, 8] * 3
    data = compress(tiny_model, tokens, level="portable").data
    monkeypatch.setenv(THREADS_ENV, setting)
    assert decompress_tokens(data, tiny_model) == tokens

"""The integer decode's thread policy (``seqkv.models.integer.threads``): it runs the faster
count, keeps trying the other, follows a change of load, and never changes a decoded token."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from seqkv.errors import InvalidConfigError
from seqkv.models import CausalLM
from seqkv.models.integer.threads import (
    BACKOFF_RATIO,
    THREADS_ENV,
    ThreadPolicy,
    decode_policy,
    others_running,
)
from seqkv.skv import compress, decompress_tokens


def _run(policy: ThreadPolicy, step_seconds: dict[int, float], steps: int) -> list[int]:
    chosen = []
    for _ in range(steps):
        threads = policy.choose()
        chosen.append(threads)
        policy.record(threads, step_seconds[threads])
    return chosen


def _quiet() -> int:
    return 0


def _probes(chosen: list[int], count: int) -> list[int]:
    return [index for index, threads in enumerate(chosen) if threads == count]


def test_each_count_is_measured_then_the_faster_runs_and_the_other_is_retried() -> None:
    """A probe within ``BACKOFF_RATIO`` of the best keeps the probe interval."""
    policy = ThreadPolicy((2, 1), explore_every=8, cores=2, load=_quiet)
    chosen = _run(policy, {2: 0.020, 1: 0.018}, 64)  # two threads a little slower
    assert chosen[:2] == [2, 1]
    assert policy.best() == 1
    probes = _probes(chosen, 2)
    assert probes[:2] == [0, 9]  # measured first; 1 measured next, then probed every 8
    assert {b - a for a, b in itertools.pairwise(probes[1:])} == {8}


def test_a_slow_probe_doubles_the_interval_up_to_the_cap() -> None:
    """Beside a competing process a 2-thread probe is far slower: probes back off (8, 16, 32,
    then the cap of 32), so they cost little of a loaded decode."""
    policy = ThreadPolicy((2, 1), explore_every=8, max_explore_every=32, cores=2,
                          load=_quiet)
    chosen = _run(policy, {2: 0.030, 1: 0.018}, 160)
    probes = _probes(chosen, 2)
    assert probes[:2] == [0, 9]
    assert [b - a for a, b in itertools.pairwise(probes[1:])] == [16, 32, 32, 32, 32]
    assert BACKOFF_RATIO * 0.018 < 0.030  # the probe counted as slow


def test_the_policy_follows_the_load_when_it_changes() -> None:
    policy = ThreadPolicy((2, 1), explore_every=4, max_explore_every=32, cores=2,
                          load=_quiet)
    _run(policy, {2: 0.030, 1: 0.018}, 40)
    assert policy.best() == 1
    chosen = _run(policy, {2: 0.011, 1: 0.018}, 80)  # the competing process ended
    assert _probes(chosen, 2)[0] < 32  # noticed within the capped interval
    assert policy.best() == 2 and chosen[-20:].count(2) >= 18  # 1 is now the slow probe


def test_more_threads_than_free_cores_never_run_and_their_probes_back_off() -> None:
    """While another process holds a core, a 2-thread step is never run (its probe counts as a
    slow one); when the core frees, the next probe runs it and the faster count wins."""
    busy = [1]
    policy = ThreadPolicy((2, 1), explore_every=4, max_explore_every=32, cores=2,
                          load=lambda: busy[0])
    assert policy.first() == 1
    chosen = _run(policy, {2: 0.011, 1: 0.018}, 200)
    assert set(chosen) == {1}
    busy[0] = 0  # the competing process ended
    chosen = _run(policy, {2: 0.011, 1: 0.018}, 60)
    assert chosen.index(2) < 32  # noticed within the capped interval
    assert policy.best() == 2 and chosen[-10:].count(2) >= 9
    assert ThreadPolicy((2, 1), cores=2, load=lambda: None).fits(2)  # load unknown: timing
    assert ThreadPolicy((2, 1), cores=1, load=_quiet).first() == 1  # one usable core


def test_the_machine_load_is_read_where_linux_gives_it() -> None:
    others = others_running()
    if Path("/proc/stat").exists():
        assert others is not None and others >= 0
    else:
        assert others is None


def test_probe_intervals_are_checked() -> None:
    for every, most in ((0, 8), (16, 8)):
        with pytest.raises(InvalidConfigError, match="explore_every"):
            ThreadPolicy((2, 1), explore_every=every, max_explore_every=most)


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

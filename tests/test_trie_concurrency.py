"""The trie under concurrent sessions from several threads: nothing lost, counters consistent."""

from __future__ import annotations

import sys
import threading

import numpy as np

from seqkv.trie import Namespace, PrefixTrie

THREADS = 8
ROUNDS = 150


def worker(trie: PrefixTrie, index: int, errors: list[BaseException]) -> None:
    rng = np.random.default_rng(index)
    namespace = Namespace(f"tenant-{index % 2}")
    try:
        for _ in range(ROUNDS):
            prompt = [int(rng.integers(3))] * 20
            tokens = prompt + rng.integers(0, 5, size=int(rng.integers(1, 12))).tolist()
            result = trie.insert(tokens, [-1.0] * len(tokens), namespace=namespace)
            assert result.session is not None
            match = trie.match(tokens, namespace=namespace)
            assert match.length == len(tokens)  # locked: nobody may evict it
            trie.nearest_sessions(tokens, 3, namespace=namespace)
            trie.release(result.session)
            if rng.random() < 0.2:
                trie.evict(int(rng.integers(1, 200)))
    except BaseException as error:  # collected and re-raised by the test
        errors.append(error)


def test_concurrent_sessions_from_several_threads() -> None:
    # NOTE: a tiny switch interval makes the interpreter hand over between threads every few
    # bytecodes, so unsynchronised read-modify-write sequences would interleave and show.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        trie = PrefixTrie(budget_bytes=600, nominal_kv_bytes_per_token=1)
        errors: list[BaseException] = []
        threads = [threading.Thread(target=worker, args=(trie, i, errors))
                   for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert errors == []
    audit = trie.audit()
    sizes = trie.sizes()
    assert sizes.sessions == 0 and sizes.protected_tokens == 0
    assert audit.total_bytes <= 600
    assert trie.stats().insert_sessions == THREADS * ROUNDS

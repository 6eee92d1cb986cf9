"""The timing gate's probe: one ratio of two sleeps, run by ``tests/test_timing_gate.py``.

Not collected by a plain ``pytest`` run (its name matches neither ``test_*.py`` nor
``bench_*.py``); the gate test runs it by path, in a subprocess, against a history in a
temporary directory. It tracks the same kind of ratio as ``bench_ratios.py``, through the same
timer and fixture (``ratio_timing``), on a synthetic workload: sleeps, whose durations hardly
depend on the machine's load, so the probe's ratio is steady (about 2.0 reference units) even on a
busy CI machine.

Invariants:
1. With ``SEQKV_GATE_PROBE_SLOWDOWN=F`` in the environment, the timed operation sleeps an extra
   F times its own duration: ratio ``2 (1 + F)`` (enforced).
"""

from __future__ import annotations

import os
import time

import pytest
from ratio_timing import PairedReference, time_ratio, timing_enabled

SLOWDOWN_VARIABLE = "SEQKV_GATE_PROBE_SLOWDOWN"
REFERENCE_SECONDS = 0.05
RATIO = 2
ROUNDS = 5


def test_probe_ratio(request: pytest.FixtureRequest) -> None:
    reference = (PairedReference("sleep", lambda: time.sleep(REFERENCE_SECONDS))
                 if timing_enabled(request.config) else None)
    seconds = RATIO * REFERENCE_SECONDS
    seconds *= 1 + float(os.environ.get(SLOWDOWN_VARIABLE, "0"))
    time_ratio(request, reference, "probe / sleep", "probe", lambda: time.sleep(seconds), ROUNDS)

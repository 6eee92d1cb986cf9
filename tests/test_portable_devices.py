"""``benchmarks/portable_devices.py`` (which ``scripts/gpu_check.sh`` runs on a GPU), dry-run on
the CPU: its "device" engine is then the integer forward's torch statement, so the logit check
compares native.c with the torch statement; the file and throughput checks run CPU against CPU
(the script's own logic)."""

from __future__ import annotations

import pytest

from benchmark_scripts import load_benchmark
from seqkv.models import CausalLM

devices = load_benchmark("portable_devices")
@pytest.mark.real_model
def test_the_logit_check_compares_two_backends_and_counts_a_difference(
        real_model: CausalLM) -> None:
    reference, other = devices.engines(real_model, "cpu")
    assert (reference.backend, other.backend) == ("native", "torch")
    tokens = real_model.encode_text("Tides follow the moon; harbours keep a calendar of them.")
    mismatches, compared = devices.logit_mismatches(reference, other, tokens)
    assert mismatches == 0 and compared >= 2 * len(tokens)

    class Shifted:  # an engine whose logits are off by one unit in one row: the check sees it
        backend = "shifted"

        def new_sequence(self):  # type: ignore[no-untyped-def]
            return other.new_sequence()

        def forward(self, calls):  # type: ignore[no-untyped-def]
            rows = other.forward(calls)
            rows[0][-1, 0] += 1
            return rows

    assert devices.logit_mismatches(reference, Shifted(), tokens)[0] > 0


@pytest.mark.real_model
def test_files_and_throughput_round_trip(real_model: CausalLM) -> None:
    checks = devices.file_checks(real_model, real_model, "cpu", 12)
    assert len(checks) == 2 * len(devices.TEXT_FILES)
    assert all(c.tokens_equal and c.kv_exact for c in checks)  # CPU to CPU: the same profile
    rates = devices.throughput(real_model, real_model, [2, 3], 6, distinct=2)
    assert [r.sessions for r in rates] == [2, 3]
    assert all(r.exact and r.decode_tokens_per_second > 0 and r.generate_tokens_per_second > 0
               for r in rates)

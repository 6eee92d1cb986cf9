"""The store bench, run tiny: every part runs and its figures hold together."""

from __future__ import annotations

import json
from pathlib import Path

from research.bench.store import StoreBenchConfig, run_store_bench
from seqkv.models import CausalLM

TINY = StoreBenchConfig(sessions=10, long_document_words=200, short_document_words=60,
                        get_sample=5, scale_sessions=120, scale_checkpoints=2, scale_probes=10,
                        throughput_sessions=40, fault_sessions=48, start_method="fork")


def test_tiny_bench_runs_every_part(tiny_model: CausalLM, tmp_path: Path) -> None:
    result = run_store_bench(tiny_model, TINY, workdir=tmp_path)
    data = result.to_json_dict()
    json.dumps(data)
    assert result.workload is not None and result.bytes is not None
    assert result.model_run is not None and result.comparison is not None
    assert result.workload.sessions == 10
    assert result.model_run.all_gets_exact
    figures = result.bytes
    assert figures.store_bytes == (figures.records + figures.index + figures.session_entries
                                   + figures.refcounts)
    assert figures.records == figures.coded_bytes + figures.record_frames
    comparison = result.comparison
    assert comparison.skv_per_session_bytes is not None
    # one file per session repeats what the store keeps once (model, profile, digests, framing)
    assert comparison.skv_per_session_bytes > figures.coded_bytes + 40 * figures.sessions
    assert [p.sessions for p in result.scale] == [60, 120]
    assert all(p.lookup_round_trips <= 1 + 3 for p in result.scale)  # index + <= 3 chains
    assert {(t.backend, t.workers) for t in result.throughput} == {
        ("directory", 1), ("directory", 2), ("redis", 1), ("redis", 2)}
    assert [(f.backend, f.lost, f.refcount_mismatches, f.orphans_after_gc)
            for f in result.faults] == [("directory", 0, 0, 0), ("redis", 0, 0, 0)]
    assert result.faults[1].server_kills == 1

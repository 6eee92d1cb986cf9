"""The rate-distortion sweep and the quantizer bench on the tiny model: every row verified,
reports written, JSON shapes; and their doctests."""

from __future__ import annotations

import doctest
import importlib
import json
from pathlib import Path

import pytest

from research.bench.quant import run_quant_bench
from research.bench.sweep import SweepGrid, SweepSetting, run_rate_distortion_sweep, write_reports
from seqkv.delta import AllocationMode, ExactRecompute, NoPrediction, TopKExpectation
from seqkv.models import CausalLM
from seqkv.provenance import start_run

PREFIX = [5, 17, 17, 3, 9, 44, 300, 12, 12, 12, 7, 101]
CONTINUATION = [40, 41, 42, 43, 44]
GRID = SweepGrid(
    predictors=(NoPrediction(), TopKExpectation(k=4), ExactRecompute()),
    quantizers=("turboquant_mse", "int8"),
    budgets=(2,),
    allocations=(AllocationMode.UNIFORM, AllocationMode.SURPRISAL_BUDGET),
)


def test_sweep_rows_reports_and_json(tiny_model: CausalLM, tmp_path: Path) -> None:
    points = run_rate_distortion_sweep(tiny_model, PREFIX, CONTINUATION, GRID)
    assert [p.kind for p in points[:2]] == ["fp16", "token_codec"]
    assert len(points) == 2 + len(GRID.configs()) == 2 + 3 * 3
    components = tiny_model.kv_components_per_token
    assert points[0].bits_per_token == 16 * components
    token_codec = points[1]
    for point in points[2:]:
        assert point.decode_seconds is not None  # decoded and verified bit for bit
        assert point.bits_per_token > 0
        if point.predictor.startswith(("top-k", "exact")):
            assert point.token_bits_per_token == pytest.approx(
                token_codec.token_bits_per_token)
            assert point.decode_cost.calls > len(PREFIX)
        else:
            assert point.token_bits_per_token == 0
        assert point.packed_bits_per_token is not None
        if point.predictor == "exact recompute":
            assert point.residual_energy is not None and point.residual_energy < 1e-10

    setting = SweepSetting(tiny_model.name, len(PREFIX), len(CONTINUATION), components,
                           "a test sequence", 1.0)
    paths = write_reports(points, tmp_path, setting, start_run("tiny", "generated"))
    markdown = paths.markdown.read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(points)  # header + one row each
    assert table[0].startswith("| method | b0 | mean b | bits/tok |")
    assert paths.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(json.dumps([p.to_json_dict() for p in points]))
    assert rows[1]["kind"] == "token_codec" and rows[2]["method"].startswith("none + ")


def test_quant_bench_json_shape() -> None:
    result = run_quant_bench(n_vectors=600, prod_seeds=1).to_json_dict()
    measured = result["turboquant_mse"]
    assert sorted(measured) == ["128", "64"]
    for row in measured.values():
        assert sorted(row) == ["1", "2", "3", "4"]
        for bits, value in row.items():
            paper = result["turboquant_mse_paper"][bits]
            assert value == pytest.approx(paper, rel=0.25)  # 0.36, 0.117, 0.03, 0.009
    assert sorted(result["turboquant_prod_ip"]) == ["128", "64"]
    assert result["rate_distortion"] == []
    json.dumps(result)


@pytest.mark.parametrize("name", ["research.bench.sweep", "research.bench.quant",
                                  "research.bench.distortion"])
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

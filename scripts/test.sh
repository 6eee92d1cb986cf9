#!/usr/bin/env bash
# Runs the whole test suite (set-up included): lint, strict typing, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRITON_INTERPRET=1
.venv/bin/ruff check src proofs kernels tests benchmarks
.venv/bin/mypy
# Benchmarks run once each here (pytest-benchmark disabled): they must work, not be timed.
.venv/bin/python -m pytest tests benchmarks "$@"

